"""``hpcpipe run``: one optimisation run, under mpiexec or launching itself with ``--np P``.

Settings come from ``--config FILE`` and the ``--key VALUE`` options (one per
setting of the schema, ``hpcpipe.cli.settings``). Every check (the settings, the
rank count, the output path, a resumed file and its lock) runs before the launch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcpipe.cli.arguments import ranks_option
from hpcpipe.cli.launch import inside_mpi, launched_ranks, relaunch, strip_np, under_mpi
from hpcpipe.errors import ConfigError

NAME = "run"
HELP = "one optimisation run (under mpiexec, or --np P to launch)"
DESCRIPTION = (
    "One optimisation run. Settings come from --config FILE (TOML) and "
    "the --key VALUE options below, which override the file."
)
PARSER = {"allow_abbrev": False}
TAKES_EXTRA = True  # an unknown --key is a config error naming the closest key

DEFAULT_OUTPUT = "runs/<problem>-<optimizer>-<time>-<pid>.h5"

# Settings a resume may change: they do not change the numbers (recorded in the file).
RESUME_MAY_CHANGE = ("progress", "timeout", "wait", "flush_every")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hpcpipe.cli.settings import add_settings

    parser.add_argument("--config", help="TOML file of settings (flat keys or a [run] table)")
    parser.add_argument(
        "--np", type=ranks_option, default=0, help="launch itself under mpiexec -n NP"
    )
    parser.add_argument("--every", type=int, default=0, help="print every N-th iteration row")
    parser.add_argument("--resume", metavar="FILE", help="continue an incomplete result file")
    parser.add_argument(
        "--trust-file",
        action="store_true",
        help="with --resume: import the package.module:attribute names the file records "
        "(runs their code; by default only names given again on the command line are imported)",
    )
    parser.add_argument(
        "--no-output",
        action="store_true",
        help=f"print the table only (default: write {DEFAULT_OUTPUT}, or --output)",
    )
    add_settings(parser)


def default_output(cfg) -> str:
    """DEFAULT_OUTPUT: a new file for every run (time stamp and process id).

    A ``package.module:factory`` name keeps only letters, digits, '.', '-' and '_'.
    """
    import os
    import re
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{cfg.problem}-{cfg.optimizer}")
    return os.path.join("runs", f"{name}-{stamp}-{os.getpid()}.h5")


def resume_config(path: str, items: list[str], args: argparse.Namespace | None = None):
    """The config stored in an incomplete result, writing to the same file, and the overrides.

    Everything is checked before any launch: the file and its resume state, that no live
    process writes it (its lock), the rank count, and the overrides: only settings that
    leave the numbers unchanged (RESUME_MAY_CHANGE) may differ; they are recorded.
    ``inject_failure`` may be cleared (``--inject-failure ''``), which is recorded too and
    holds for later resumes of the file. Returns (config, changed settings, recorded rank count).
    """
    import dataclasses

    from hpcpipe.run.config import check_path, make_config, refuse_recorded_code
    from hpcpipe.run.results import (
        ResultsError,
        check_unlocked,
        cleared_injection,
        load,
        read_state,
        recover_truncated,
    )

    check_path("--resume", path, write=True)  # the run goes on writing it
    try:
        recover_truncated(path, log=lambda m: print(f"hpcpipe: {m}", file=sys.stderr))
        read_state(path)  # checks the file, its status and its state
        check_unlocked(path)
        r = load(path)
    except ResultsError as e:
        raise ConfigError(f"--resume {e}") from None
    except OSError as e:
        raise ConfigError(f"--resume {path}: {e.strerror}") from None
    if args is not None and (args.config or args.no_output):
        flag = "--config" if args.config else "--no-output"
        raise ConfigError(
            f"--resume {path} continues the run its file records: {flag} cannot be combined "
            "with it (start a new run instead)"
        )
    values = dict(r.config)
    values.update(cleared_injection(r.attrs))
    given_keys, given_values = {}, {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: write --key value")
        k, v = item.split("=", 1)
        given_keys[k.strip().replace("-", "_")] = k.strip()
        given_values[k.strip().replace("-", "_")] = v
    trusted = bool(getattr(args, "trust_file", False))
    refuse_recorded_code(values, given_values, path, trusted)  # before anything is imported
    recorded = make_config({**values, "output": ""})
    values.update(given_values)
    out = values.pop("output", "") if "output" in given_keys else ""
    if "output" in given_keys and Path(out or ".").resolve() != Path(path).resolve():
        raise ConfigError(
            f"--resume {path}: --output {out!r} cannot be changed on resume: a resume "
            f"appends to the file it continues ({path}); copy it first to continue elsewhere"
        )
    given_keys.pop("output", None)
    cfg = make_config({**values, "output": ""})
    changed = {}
    for key, flag in given_keys.items():
        new, old = getattr(cfg, key), getattr(recorded, key)
        if new == old:
            continue
        if key == "inject_failure" and new == "":  # cleared: the run goes on past it
            changed[key] = new
            continue
        if key not in RESUME_MAY_CHANGE:
            raise ConfigError(
                f"--resume {path}: --{flag} {new!r} cannot be changed on resume: the file "
                f"records {key} = {old!r} and its rows so far were made with it. Start a new "
                f"run to change it; a resume may change only {', '.join(RESUME_MAY_CHANGE)} "
                "and clear inject_failure (--inject-failure '')"
            )
        changed[key] = new
    ranks = r.attrs.get("n_ranks")
    return dataclasses.replace(cfg, output=path), changed, ranks


def rank_error(path: str, recorded, size: int) -> str | None:
    """Why a result written by ``recorded`` ranks cannot be resumed on ``size``, or None."""
    if recorded is not None and int(recorded) != size:
        return (
            f"--resume {path} was written by {int(recorded)} ranks; resume it on "
            f"{int(recorded)} (--np {int(recorded)}), not {size}: the iterates match only "
            "for the same rank count"
        )
    return None


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.cli.settings import items
    from hpcpipe.run.config import load, validate

    changed, ranks = {}, None
    try:
        if args.resume:
            cfg, changed, ranks = resume_config(args.resume, items(args, extra), args)
            err = rank_error(args.resume, ranks, args.np) if args.np else None
            if err:
                raise ConfigError(err)
        else:
            # depth not given: the rank count when larger (every rank owns a layer)
            cfg = load(args.config, items(args, extra), ranks=args.np or launched_ranks())
        if args.np:
            validate(cfg, args.np, check_output=not args.resume)
    except ConfigError as e:
        print(f"hpcpipe: config error: {e}", file=sys.stderr)
        return 2
    if args.np and not inside_mpi():
        return relaunch(args.np, strip_np(argv))

    def body(comm) -> int:
        import dataclasses

        from hpcpipe.errors import ResultsError
        from hpcpipe.run.runner import run as run_config
        from hpcpipe.run.table import print_run

        try:
            validate(cfg, comm.size, check_output=False)
            err = rank_error(args.resume, ranks, comm.size) if args.resume else None
            if err:
                raise ConfigError(err)
        except ConfigError as e:
            if comm.rank == 0:
                print(f"hpcpipe: config error: {e}", file=sys.stderr)
            return 2
        run_cfg = cfg
        if not cfg.output and not args.no_output:  # results always reach a file by default
            path = comm.bcast(default_output(cfg) if comm.rank == 0 else None, root=0)
            run_cfg = dataclasses.replace(cfg, output=path)
        try:  # also settings only the built problem can check (its depth)
            res = run_config(
                run_cfg, comm, resume=args.resume or None, resume_overrides=changed or None
            )
        except (ConfigError, ResultsError) as e:  # raised on every rank alike
            if comm.rank == 0:
                print(f"hpcpipe: {e}", file=sys.stderr)
            return 2
        if comm.rank == 0:
            print_run(res, every=args.every)
            if run_cfg.output:
                print(f"wrote {run_cfg.output} (status {res.status})")
        return 143 if res.status == "incomplete" else 0

    return under_mpi(body)
