"""``hpcpipe calibrate``: measure this machine's cost model into a profile (TOML).

The profile holds α + β·bytes per wait policy at the launch's rank count and
placement, the wake-up latency of a waiting rank, the built-in layers'
forward/backward times at the given widths, optionally the emulated
``layer_time``, the machine's identity and the fit residuals
(``hpcpipe.machine.calibrate``, ``hpcpipe.machine.profile``). Use it with
``hpcpipe run --machine FILE``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

NAME = "calibrate"
HELP = "measure this machine's cost model (alpha, beta, wake-up, layer times) into a TOML profile"
POLICIES = ("busy", "yield", "sleep")
KINDS = ("orthogonal", "dense", "mlp")
WIDTHS = (16, 32, 64, 128, 256)  # the settings' defaults (dim 16, width 32), digits, the studies'


def _ranks(text: str) -> int:
    if not re.fullmatch(r"\s*[0-9]{1,7}\s*", text) or int(text) < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r}: calibration needs a whole number of ranks >= 2 (a message needs a receiver)"
        )
    return int(text)


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in names if x not in allowed]
        if not names or bad:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a comma-separated list of {', '.join(allowed)}"
            )
        return names

    return parse


def _ints(what: str, low: int):
    def parse(text: str) -> tuple[int, ...]:
        parts = [x.strip() for x in text.split(",") if x.strip()]
        if not parts or not all(re.fullmatch(r"[0-9]{1,9}", x) and int(x) >= low for x in parts):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give comma-separated whole numbers >= {low} ({what})"
            )
        return tuple(int(x) for x in parts)

    return parse


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0 or v > 60:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds in [0, 60]")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--np", type=_ranks, default=2, help="ranks of the launch: the run's rank count (>= 2)"
    )
    parser.add_argument("--output", "-o", default="", help="the profile to write (TOML)")
    parser.add_argument(
        "--sweep",
        default="",
        help="calibrate every profile the sweep file's points name (machine =), each at its "
        "points' rank count, wait policy, width and layer_time; existing ones are kept",
    )
    parser.add_argument(
        "--wait",
        type=_names(POLICIES),
        default=POLICIES,
        help="comma-separated wait policies to measure (default busy,yield,sleep)",
    )
    parser.add_argument(
        "--width",
        type=_ints("layer widths", 1),
        default=WIDTHS,
        help="comma-separated layer widths to time (the runs' widths; default "
        + ",".join(map(str, WIDTHS))
        + ")",
    )
    parser.add_argument(
        "--rows", type=_ints("rows per item", 1), default=(1,), help="rows per item (default 1)"
    )
    parser.add_argument(
        "--kinds",
        type=_names(KINDS),
        default=KINDS,
        help="comma-separated layer kinds to time (default orthogonal,dense,mlp)",
    )
    parser.add_argument(
        "--layer-time",
        type=_seconds,
        default=0.0,
        help="also time the emulated action of this many seconds (the run's --layer-time)",
    )
    parser.add_argument(
        "--sizes",
        type=_ints("message payload bytes", 8),
        default=None,
        help="comma-separated message payload sizes in bytes (default 8,2048,16384,131072)",
    )
    parser.add_argument(
        "--budget",
        type=_seconds,
        default=1.0,
        help="seconds at most per (wait policy, size) relay measurement (default 1)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an existing profile at --output"
    )


def output_error(path: str, force: bool) -> str | None:
    """Why the profile cannot be written at ``path``, or None (nothing is overwritten
    unless ``--force``)."""
    from hpcpipe.run.config import path_error

    p = Path(path)
    if not path:
        return "--output: an empty path"
    err = path_error("--output", path, write=True)
    if err:
        return err
    if p.is_dir():
        return f"--output {path} is a folder: give a file name"
    if p.is_symlink() and not p.exists():
        return f"--output {path} is a dangling symbolic link"
    if not p.parent.is_dir():
        return f"--output {path}: folder {str(p.parent)!r} does not exist (create it first)"
    if p.exists() and not force:
        return f"--output {path} exists: kept (--force replaces it)"
    return None


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    import os

    from hpcpipe.cli.launch import INSIDE, relaunch, strip_np, under_mpi

    if extra:
        print(f"hpcpipe calibrate: unrecognised arguments {' '.join(extra)}", file=sys.stderr)
        return 2
    if args.sweep and not os.environ.get(INSIDE):
        return for_sweep(args, argv)
    if not args.output:
        print("hpcpipe: --output: give the profile to write (or --sweep FILE)", file=sys.stderr)
        return 2
    err = output_error(args.output, args.force)
    if err and not os.environ.get(INSIDE):
        print(f"hpcpipe: {err}", file=sys.stderr)
        return 2
    if not os.environ.get(INSIDE):
        return relaunch(args.np, strip_np(argv))

    def body(comm) -> int:
        from hpcpipe.machine.calibrate import SIZES, Plan, calibrate
        from hpcpipe.machine.profile import dumps, parse
        from hpcpipe.run import atomic

        plan = Plan(
            policies=args.wait,
            sizes=args.sizes or SIZES,
            kinds=args.kinds,
            widths=args.width,
            rows=args.rows[0],
            layer_time=args.layer_time,
            budget=args.budget,
            command=os.environ.get("HPCPIPE_COMMAND", ""),
        )
        data = calibrate(comm, plan)
        if comm.rank != 0:
            return 0
        text = dumps(data)
        parse(text, args.output)  # what is written reads back (checked before writing)
        atomic.write_text(args.output, text)  # whole or not at all: a temporary file renamed
        print(summary(data))
        if data["machine"].get("busy"):
            print(f"warning: {data['machine']['busy_note']}", file=sys.stderr)
        print(f"wrote {args.output} ({data['machine']['seconds']:.1f} s of measurement)")
        return 0

    return under_mpi(body)


def _passed_on(argv: list[str]) -> list[str]:
    """The options of ``argv`` a profile of the sweep also gets (sizes, budget, kinds, rows)."""
    out, keep = [], ("--sizes", "--budget", "--kinds", "--rows")
    for i, w in enumerate(argv):
        name = w.split("=", 1)[0]
        if name in keep:
            out += [w] if "=" in w else argv[i : i + 2]
    return out


def for_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    """``--sweep FILE``: one ``hpcpipe calibrate`` launch per missing profile of the sweep."""
    import subprocess

    from hpcpipe.cli.launch import hpcpipe_args
    from hpcpipe.errors import ConfigError
    from hpcpipe.machine.sweep_profiles import needs

    if args.output:
        print("hpcpipe: --output: not with --sweep (the sweep names its profiles)", file=sys.stderr)
        return 2
    try:
        todo = needs(args.sweep)
    except ConfigError as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    extra = _passed_on(argv)
    for need in todo:
        if Path(need.path).exists() and not args.force:
            print(f"kept {need.path} ({need.ranks} ranks; --force calibrates again)")
            continue
        Path(need.path).parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            *hpcpipe_args(),
            *need.argv(extra),
            *(["--force"] if args.force else []),
        ]
        print(f"calibrating {need.path} at {need.ranks} ranks", flush=True)
        code = subprocess.call(cmd)
        if code:
            return code
    return 0


def summary(data: dict) -> str:
    """The profile's figures as a few lines for the terminal."""
    m, p = data["machine"], data["placement"]
    lines = [
        f"machine {m['host']} ({m['cores']} cores, {m['mpi_library']}), {p['ranks']} ranks on "
        f"{len(p['hosts'])} host(s), load {m['load_start']} -> {m['load_end']}"
    ]
    for pol, c in data["message"].items():
        lines.append(
            f"  wait {pol:5s}: alpha {c['alpha'] * 1e6:9.1f} us, beta {c['beta'] * 1e9:8.3f} "
            f"ns/B, residual {c['residual']:.3f}, wake-up {c['wakeup'] * 1e6:9.1f} us"
        )
    for c in data["layers"]:
        lines.append(
            f"  layer {c['kind']:10s} width {c['width']:5d} x {c['rows']} rows: forward "
            f"{c['forward'] * 1e6:8.1f} us, backward {c['backward'] * 1e6:8.1f} us"
        )
    if data.get("emulated"):
        e = data["emulated"]
        lines.append(
            f"  emulated layer_time {e['layer_time'] * 1e3:g} ms: "
            f"measured {e['sleep'] * 1e3:.3f} ms"
        )
    return "\n".join(lines)
