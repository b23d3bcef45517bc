"""The hpcpipe command line: run, sweep, analyze, simulate, trace and plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcpipe import __version__
from hpcpipe.cli.settings import add_settings, given
from hpcpipe.run.config import ConfigError

DESCRIPTION = (
    "hpcpipe: pipeline-parallel optimization (GD, AGD, PPRS) over MPI ranks; "
    "each command has its own --help."
)
DEFAULT_OUTPUT = "runs/<problem>-<optimizer>-<time>-<pid>.h5"


def registry_argument(registry) -> dict:
    """argparse keywords for a name read from ``registry``: its names are the choices,
    ``package.module:attribute`` is accepted too, and a bad name gets the registry's message."""

    class Names:
        def __contains__(self, name: object) -> bool:
            return isinstance(name, str) and registry.check(name) is None

        def __iter__(self):
            return iter([n for n in registry.names() if ":" not in n])

    def name(text: str) -> str:
        err = registry.check(text)
        if err:
            raise argparse.ArgumentTypeError(err)
        return text

    names = "|".join(Names())
    return {
        "type": name,
        "choices": Names(),
        "metavar": f"{{{names}}}|module:attr",
    }


def _schedule_argument() -> dict:
    from hpcpipe.pipeline.schedules import SCHEDULES

    return registry_argument(SCHEDULES)


def cmd_schedule(args) -> int:
    from hpcpipe.pipeline.summary import schedule_command

    return schedule_command(args)


def cmd_info(args) -> int:
    import h5py
    import mpi4py
    import numpy
    from mpi4py import MPI

    print(f"hpcpipe {__version__}")
    print(f"numpy {numpy.__version__}, mpi4py {mpi4py.__version__}, h5py {h5py.__version__}")
    print(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}")
    from hpcpipe.cli.launch import LauncherError, find_mpiexec

    try:
        print(f"mpiexec: {find_mpiexec()}")
    except LauncherError as e:
        print(f"mpiexec: {e}")
    return 0


INSIDE = "HPCPIPE_INSIDE_MPI"


def _overrides(extra: list[str]) -> list[str]:
    """``--key value`` / ``--key=value`` / ``key=value`` words into ``key=value`` items.

    The settings' own options are parsed by argparse; what is left here is an
    unknown ``--key``, which stops with the config error naming the closest key.
    """
    from hpcpipe.run.config import FIELDS, unknown_key

    out, i = [], 0
    while i < len(extra):
        w = extra[i]
        if w.startswith("--"):
            w = w[2:]
            if w.split("=", 1)[0].replace("-", "_") not in FIELDS:
                raise unknown_key(w.split("=", 1)[0])
            if "=" not in w:
                if i + 1 >= len(extra):
                    raise SystemExit(f"hpcpipe: option --{w} needs a value")
                w = f"{w}={extra[i + 1]}"
                i += 1
        out.append(w)
        i += 1
    return out


def _relaunch(np_: int, argv: list[str]) -> int:
    """Run this command again under ``mpiexec -n np`` and return its exit code."""
    import os
    import subprocess

    from hpcpipe.cli.launch import (
        LAUNCHER_PID,
        LauncherError,
        die_with_parent,
        launcher_identity,
        mpiexec_command,
    )

    try:
        cmd = mpiexec_command(np_, ["-m", "hpcpipe", *argv])
    except LauncherError as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    import signal

    env = dict(os.environ, **{INSIDE: "1", LAUNCHER_PID: launcher_identity()})
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    # if this launcher is killed (even by SIGKILL), mpiexec gets SIGTERM and the ranks,
    # which also watch this process, flush their results and stop
    proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent(os.getpid()))

    def forward(signum, frame):  # SIGTERM / SIGINT reach mpiexec, which passes them on
        proc.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _under_mpi(func) -> int:
    """Run ``func(comm)`` on every rank; an exception on any rank aborts the job."""
    import traceback

    from mpi4py import MPI

    from hpcpipe.cli.launch import watch_launcher

    comm = MPI.COMM_WORLD
    watch_launcher()
    try:
        return func(comm)
    except BaseException as e:  # noqa: BLE001 - any failure must bring the job down
        if isinstance(e, SystemExit) and not e.code:
            raise
        tb = traceback.format_exc()
        sys.stderr.write(f"hpcpipe: rank {comm.rank} of {comm.size} failed: {e!r}\n{tb}")
        sys.stderr.flush()
        if comm.size > 1:
            comm.Abort(1)
        return 1


def _ranks_option(text: str) -> int:
    """``--np``: a whole number of ranks >= 1 in ASCII digits (argparse exits 2 otherwise)."""
    import re

    if not re.fullmatch(r"\s*[0-9]{1,7}\s*", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the number of ranks must be a whole number >= 1"
        )
    return int(text)


def _strip_np(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, w in enumerate(argv):
        if skip:
            skip = False
            continue
        if w == "--np":
            skip = True
            continue
        if w.startswith("--np="):
            continue
        out.append(w)
        del i
    return out


# Settings a resume may change: they do not change the numbers (recorded in the file).
RESUME_MAY_CHANGE = ("progress", "timeout", "wait", "flush_every")


def _resume_config(path: str, items: list[str], args=None):
    """The config stored in an incomplete result, writing to the same file, and the overrides.

    Everything is checked before any launch: the file and its resume state, that no live
    process writes it (its lock), the rank count, and the overrides: only settings that
    leave the numbers unchanged (RESUME_MAY_CHANGE) may differ; they are recorded.
    """
    import dataclasses

    from hpcpipe.run.config import make_config
    from hpcpipe.run.results import ResultsError, check_unlocked, load, read_state

    try:
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
    recorded = make_config({**values, "output": ""})
    given_keys = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: write --key value")
        k, v = item.split("=", 1)
        given_keys[k.strip().replace("-", "_")] = k.strip()
        values[k.strip().replace("-", "_")] = v
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
        if key not in RESUME_MAY_CHANGE:
            raise ConfigError(
                f"--resume {path}: --{flag} {new!r} cannot be changed on resume: the file "
                f"records {key} = {old!r} and its rows so far were made with it. Start a new "
                f"run to change it; a resume may change only {', '.join(RESUME_MAY_CHANGE)}"
            )
        changed[key] = new
    ranks = r.attrs.get("n_ranks")
    return dataclasses.replace(cfg, output=path), changed, ranks


def _rank_error(path: str, recorded, size: int) -> str | None:
    if recorded is not None and int(recorded) != size:
        return (
            f"--resume {path} was written by {int(recorded)} ranks; resume it on "
            f"{int(recorded)} (--np {int(recorded)}), not {size}: the iterates match only "
            "for the same rank count"
        )
    return None


def cmd_validate(args, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.run.config import ConfigError, load, validate

    try:
        cfg = load(args.config, given(args) + _overrides(extra))
        validate(cfg, args.np or None)
    except ConfigError as e:
        print(f"hpcpipe: config error: {e}", file=sys.stderr)
        return 2
    ranks = f" on {args.np} ranks" if args.np else ""
    print(
        f"ok: {cfg.problem}, depth {cfg.depth}, {cfg.optimizer} ({cfg.mode}), "
        f"schedule {cfg.schedule}{ranks}"
    )
    return 0


def _default_output(cfg) -> str:
    """DEFAULT_OUTPUT: a new file for every run (time stamp and process id).

    A ``package.module:factory`` name keeps only letters, digits, '.', '-' and '_'.
    """
    import os
    import re
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{cfg.problem}-{cfg.optimizer}")
    return os.path.join("runs", f"{name}-{stamp}-{os.getpid()}.h5")


def cmd_run(args, extra: list[str], argv: list[str]) -> int:
    import os

    from hpcpipe.run.config import load, validate

    changed, ranks = {}, None
    try:
        if args.resume:
            items = given(args) + _overrides(extra)
            cfg, changed, ranks = _resume_config(args.resume, items, args)
            err = _rank_error(args.resume, ranks, args.np) if args.np else None
            if err:
                raise ConfigError(err)
        else:
            cfg = load(args.config, given(args) + _overrides(extra))
        if args.np:
            validate(cfg, args.np, check_output=not args.resume)
    except ConfigError as e:
        print(f"hpcpipe: config error: {e}", file=sys.stderr)
        return 2
    if args.np and not os.environ.get(INSIDE):
        return _relaunch(args.np, _strip_np(argv))

    def body(comm):
        import dataclasses

        from hpcpipe.run.results import ResultsError
        from hpcpipe.run.runner import run
        from hpcpipe.run.table import print_run

        try:
            validate(cfg, comm.size, check_output=False)
            err = _rank_error(args.resume, ranks, comm.size) if args.resume else None
            if err:
                raise ConfigError(err)
        except ConfigError as e:
            if comm.rank == 0:
                print(f"hpcpipe: config error: {e}", file=sys.stderr)
            return 2
        run_cfg = cfg
        if not cfg.output and not args.no_output:  # results always reach a file by default
            path = comm.bcast(_default_output(cfg) if comm.rank == 0 else None, root=0)
            run_cfg = dataclasses.replace(cfg, output=path)
        try:  # also settings only the built problem can check (its depth)
            res = run(run_cfg, comm, resume=args.resume or None, resume_overrides=changed or None)
        except (ConfigError, ResultsError) as e:  # raised on every rank alike
            if comm.rank == 0:
                print(f"hpcpipe: {e}", file=sys.stderr)
            return 2
        if comm.rank == 0:
            print_run(res, every=args.every)
            if run_cfg.output:
                print(f"wrote {run_cfg.output} (status {res.status})")
        return 143 if res.status == "incomplete" else 0

    return _under_mpi(body)


def cmd_demo(args, extra: list[str], argv: list[str]) -> int:
    import os

    if not os.environ.get(INSIDE):
        return _relaunch(args.np, _strip_np(argv))

    def body(comm):
        from hpcpipe.run.demo import demo

        return demo(comm, budget=args.budget)

    return _under_mpi(body)


def cmd_simulate(args) -> int:
    from hpcpipe.pipeline import schedules
    from hpcpipe.pipeline.simulator import closed_form, gantt_rows, simulate_uniform

    res = simulate_uniform(
        args.schedule,
        args.stages,
        args.items,
        args.t_forward,
        args.t_backward,
        args.message,
        record=bool(args.plot),
    )
    print(
        f"schedule {args.schedule}: S = {args.stages} stages, n = {args.items} items, "
        f"{len(res.schedule)} actions; t_F = {args.t_forward}, t_B = {args.t_backward}, "
        f"message cost c = {args.message}"
    )
    print(
        f"makespan {res.makespan:.6g}; bubble fraction {res.bubble_fraction:.4f}; "
        f"max in flight {max(schedules.max_in_flight(res.schedule))}"
    )
    try:
        cf = closed_form(
            args.schedule, args.stages, args.items, args.t_forward, args.t_backward, args.message
        )
        note = schedules.entry(args.schedule).closed_form_note
        print(f"closed form {cf:.6g} (difference {res.makespan - cf:.3g}; {note})")
    except ValueError as e:
        print(f"closed form: {e}")
    if args.plot:
        from hpcpipe.run.trace import gantt_png

        err = _output_error(args.plot, (), args.force)
        if err:
            print(f"hpcpipe: {err.replace('-o ', '--plot ')}", file=sys.stderr)
            return 2
        gantt_png(
            gantt_rows(res),
            args.plot,
            f"{args.schedule}, S={args.stages}, n={args.items} (simulated)",
            "τ, model time unit",
        )
        print(f"wrote {args.plot}")
    return 0


def _load_result(path: str):
    """The result at path, or None after printing why it cannot be read."""
    from hpcpipe.run.results import ResultsError, load

    try:
        return load(path)
    except ResultsError as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return None


def _output_error(path: str, inputs: tuple[str, ...] = (), force: bool = False) -> str | None:
    """Why ``-o path`` cannot be written, or None: result files are never overwritten.

    An existing HDF5 file (a result) is replaced only with ``--force``; the file a
    command reads is never its own output.
    """
    from hpcpipe.run.superblock import SIGNATURE

    p = Path(path)
    if not path:
        return "-o: an empty path"
    for src in inputs:
        if p.exists() and Path(src).exists() and p.resolve() == Path(src).resolve():
            return f"-o {path} is the file this command reads: choose another output"
    if p.is_symlink() and not p.exists():
        return f"-o {path} is a dangling symbolic link"
    if p.is_dir():
        return f"-o {path} is a folder: give a file name"
    parent = p.parent
    if not parent.exists():
        return f"-o {path}: folder {str(parent)!r} does not exist (create it first)"
    if not parent.is_dir():
        return f"-o {path}: {str(parent)!r} is a file, not a folder"
    if p.exists():
        try:
            with open(p, "rb") as fh:
                is_h5 = fh.read(8) == SIGNATURE
        except OSError as e:
            return f"-o {path}: cannot be read ({e.strerror})"
        if is_h5 and not force:
            return f"-o {path} holds an HDF5 file (a result?): kept (--force replaces it)"
    return None


def _recorded_iteration(r, wanted: int | None, source: str) -> int | str:
    """The iteration to draw (default the last recorded) or a message why it cannot be."""
    its = sorted(set(r.timeline["iteration"].tolist()))
    if not its:
        return f"{source} has no recorded timeline"
    if wanted is None:
        return int(its[-1])
    if wanted not in its:
        shown = ", ".join(map(str, its[:8])) + (f", ... {its[-1]}" if len(its) > 8 else "")
        return f"--iteration {wanted} was not recorded in {source}; recorded: {shown}"
    return wanted


def _picture_source(args, default_last: bool):
    """For ``trace`` and ``plot``: refuse a bad ``-o``, load the result, resolve
    ``--iteration`` (None: all of them, or the last recorded with ``default_last``).

    Returns (result, iteration) or an exit status after printing why.
    """
    err = _output_error(args.output, (args.result,), args.force)
    if err:
        print(f"hpcpipe: {err}", file=sys.stderr)
        return 2
    r = _load_result(args.result)
    if r is None:
        return 2
    if args.iteration is None and not default_last:
        return r, None
    it = _recorded_iteration(r, args.iteration, args.result)
    if isinstance(it, str):
        print(f"hpcpipe: {it}", file=sys.stderr)
        return 2
    return r, it


def cmd_trace(args) -> int:
    from hpcpipe.run.trace import write_trace

    got = _picture_source(args, default_last=False)
    if isinstance(got, int):
        return got
    r, it = got
    its = None if it is None else [it]
    clock = str(r.attrs.get("clock", "wall"))
    flush_every = int(r.config.get("flush_every", 0))
    n = write_trace(r.timeline, args.output, clock, its, r.iterations, flush_every)
    unit = "1 us drawn = 1 tau" if clock == "model" else "wall-clock time"
    print(
        f"wrote {n} trace events to {args.output} ({clock} clock, {unit}; open in ui.perfetto.dev)"
    )
    return 0


def cmd_export(args) -> int:
    from hpcpipe.run.export import ExportError, export

    r = _load_result(args.result)
    if r is None:
        return 2
    prefix = args.output or str(Path(args.result).with_suffix(""))
    try:
        paths = export(r, args.format, prefix)
    except ExportError as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(f"wrote {p}")
    return 0


def cmd_plot(args) -> int:
    from hpcpipe.run.trace import gantt_png, timeline_rows

    got = _picture_source(args, default_last=True)
    if isinstance(got, int):
        return got
    r, it = got
    clock = str(r.attrs.get("clock", "wall"))
    gantt_png(
        timeline_rows(r.timeline, it),
        args.output,
        f"{Path(args.result).name}: iteration {it} ({clock} clock)",
        "τ, model time unit" if clock == "model" else "s",
    )
    print(f"wrote {args.output}")
    return 0


def cmd_bench(args, extra: list[str], argv: list[str]) -> int:
    import os

    if args.case == "simulate":
        from hpcpipe.bench.simulate import bench_simulate

        return bench_simulate(args.repeats)
    if args.case == "study":
        from hpcpipe.bench.study import bench_study

        depths = [int(x) for x in (args.depth or "64,512,4096").split(",") if x]
        return bench_study(depths, 16, int(args.samples.split(",")[0]), args.repeats)
    if not os.environ.get(INSIDE):
        if args.case == "peer":
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                from hpcpipe.bench.peer import INSTALL

                print(f"hpcpipe: {INSTALL}", file=sys.stderr)
                return 2
        np_ = args.np or (2 if args.case in ("transport", "dense", "peer") else 4)
        return _relaunch(np_, _strip_np(argv))

    def body(comm):
        ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
        if args.case == "transport":
            from hpcpipe.bench.transport import bench_transport

            return bench_transport(
                comm, args.max_bytes, args.iters, args.wait, args.repeats, args.min_bytes
            )
        if args.case == "peer":
            from hpcpipe.bench.peer import bench_peer

            return bench_peer(
                comm, ints(args.width), ints(args.mb), ints(args.micro), args.repeats, args.port
            )
        if args.case == "dense":
            from hpcpipe.bench.dense import bench_dense

            return bench_dense(
                comm, ints(args.width), ints(args.mb), ints(args.micro), args.repeats
            )
        from hpcpipe.bench.pipeline import bench_pipeline

        return bench_pipeline(
            comm,
            ints(args.depth),
            ints(args.samples),
            args.layer_time,
            args.schedules.split(","),
            args.repeats,
            args.spin,
            args.wait,
        )

    return _under_mpi(body)


def cmd_sweep(args, extra: list[str], argv: list[str]) -> int:
    import os

    from hpcpipe.studies.sweep import describe, load_sweep, main_inside

    try:
        sweep = load_sweep(args.sweep, args.out)
    except ConfigError as e:
        print(f"hpcpipe: config error: {e}", file=sys.stderr)
        return 2
    indices = None
    if args.point is not None:
        if not 0 <= args.point < len(sweep.points):
            print(
                f"hpcpipe: --point {args.point}: the sweep has points 0..{len(sweep.points) - 1}",
                file=sys.stderr,
            )
            return 2
        indices = [args.point]
    if args.list:
        describe(sweep)
        return 0
    if not os.environ.get(INSIDE) and not args.inside:
        from hpcpipe.studies.sweep import SweepLock

        try:  # the ranks take it for real; this gives the message before any launch
            SweepLock(sweep.out, shared=indices is not None).release()
        except ConfigError as e:
            print(f"hpcpipe: {e}", file=sys.stderr)
            return 2
    ranks = max(sweep.points[i].ranks for i in (indices or range(len(sweep.points))))
    if not os.environ.get(INSIDE) and not args.inside:
        return _relaunch(args.np or ranks, ["sweep", *_strip_np(argv[1:]), "--inside"])
    return _under_mpi(lambda comm: main_inside(comm, args.sweep, args.out, indices))


def cmd_analyze(args, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.studies.report import main as analyze

    return analyze(extra)


def cmd_jobs(args) -> int:
    from hpcpipe.studies.jobs import JobOptions, generate

    opts = JobOptions(
        partition=args.partition,
        account=args.account,
        time=args.time,
        nodes=args.nodes,
        tasks_per_node=args.ntasks_per_node,
        launcher=args.launcher,
        mpi=args.mpi,
        python=args.python,
        activate=args.activate,
        overcommit=args.overcommit,
    )
    try:
        files = generate(args.sweep, args.out, opts)
    except (ConfigError, ValueError) as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    for f in files:
        print(f"wrote {f}")
    print(f"submit with: {Path(args.out) / 'submit.sh'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcpipe", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"hpcpipe {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser(
        "schedule",
        help="print a schedule's per-rank action grid, makespan, bubble and memory",
        description="Print which action (sF(i): forward of item i on stage s, sB(i): "
        "backward, sI(i) / sW(i): its input / weight halves) each rank runs, step by step, "
        "then the makespan on the model clock, the bubble fraction and the peak stashed "
        "activations per rank.",
    )
    s.add_argument(
        "kind",
        nargs="?",
        help="the schedule (a registered name or package.module:builder)",
        **_schedule_argument(),
    )
    s.add_argument(
        "--ranks", "--stages", dest="ranks", type=int, default=4, help="ranks P (default 4)"
    )
    s.add_argument("--items", type=int, default=8, help="work items n per call (default 8)")
    s.add_argument("--virtual", type=int, default=None, help="stages per rank (interleaved)")
    s.add_argument("--t-forward", type=float, default=1.0, help="t_F per stage (default 1)")
    s.add_argument("--t-backward", type=float, default=2.0, help="t_B per stage (default 2)")
    s.add_argument("--t-input", type=float, default=None, help="t_I (default t_B/2)")
    s.add_argument("--t-weight", type=float, default=None, help="t_W (default t_B/2)")
    s.add_argument("--message", type=float, default=0.0, help="message cost c between ranks")
    s.add_argument("--item-bytes", type=float, default=None, help="bytes one item stashes")
    s.add_argument("--max-steps", type=int, default=None, help="print at most this many steps")
    s.add_argument("--from-csv", default="", help="read torch's CSV schedule instead of a name")
    s.add_argument("--write-csv", default="", help="also write the schedule as torch's CSV")
    s.set_defaults(func=cmd_schedule)

    s = sub.add_parser(
        "run",
        help="one optimisation run (under mpiexec, or --np P to launch)",
        description="One optimisation run. Settings come from --config FILE (TOML) and "
        "the --key VALUE options below, which override the file.",
        allow_abbrev=False,
    )
    s.add_argument("--config", help="TOML file of settings (flat keys or a [run] table)")
    s.add_argument("--np", type=_ranks_option, default=0, help="launch itself under mpiexec -n NP")
    s.add_argument("--every", type=int, default=0, help="print every N-th iteration row")
    s.add_argument("--resume", metavar="FILE", help="continue an incomplete result file")
    s.add_argument(
        "--no-output",
        action="store_true",
        help=f"print the table only (default: write {DEFAULT_OUTPUT}, or --output)",
    )
    add_settings(s)
    s.set_defaults(func=cmd_run, takes_extra=True)

    s = sub.add_parser("sweep", help="run a grid of configurations, one HDF5 file per point")
    s.add_argument("sweep", help="sweep file (TOML)")
    s.add_argument("--out", help="results directory (default: the file's [sweep] out)")
    s.add_argument("--point", type=int, help="run only this grid point (Slurm array task)")
    s.add_argument("--list", action="store_true", help="list the points and their state")
    s.add_argument(
        "--np", type=_ranks_option, default=0, help="ranks of the launch (default: largest)"
    )
    s.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_sweep, takes_extra=True)

    s = sub.add_parser(
        "analyze", help="scaling studies and report from result directories", add_help=False
    )
    s.set_defaults(func=cmd_analyze, takes_extra=True)

    s = sub.add_parser("jobs", help="Slurm batch scripts for a sweep")
    s.add_argument("action", choices=["generate"])
    s.add_argument("sweep", help="sweep file (TOML)")
    s.add_argument("--out", required=True, help="folder for the scripts, results and report")
    s.add_argument("--partition", default="")
    s.add_argument("--account", default="")
    s.add_argument("--time", default="01:00:00", help="time limit per task (HH:MM:SS)")
    s.add_argument("--nodes", type=int, default=0)
    s.add_argument("--ntasks-per-node", type=int, default=0)
    s.add_argument("--launcher", choices=["srun", "mpiexec"], default="srun")
    s.add_argument("--mpi", default="pmi2", help="srun --mpi plugin (mpich wheel: pmi2)")
    s.add_argument("--python", default="python3", help="the Python that has hpcpipe")
    s.add_argument("--activate", default="", help="virtual environment to activate in jobs")
    s.add_argument("--overcommit", action="store_true", help="allow more tasks than cores")
    s.set_defaults(func=cmd_jobs)

    s = sub.add_parser(
        "validate",
        help="check a configuration without running it",
        description="Check a configuration (a TOML file, the --key VALUE options, or both) "
        "without running it.",
        allow_abbrev=False,
    )
    s.add_argument("config", nargs="?", help="TOML file (optional)")
    s.add_argument("--np", type=_ranks_option, default=0, help="check it fits this many ranks")
    add_settings(s)
    s.set_defaults(func=cmd_validate, takes_extra=True)

    s = sub.add_parser("demo", help="GD vs AGD vs PPRS on the digits attack, 4 local ranks")
    s.add_argument("--np", type=_ranks_option, default=4, help="number of ranks (default 4)")
    s.add_argument("--budget", type=float, default=0.0, help="pipeline time budget in tau")
    s.set_defaults(func=cmd_demo, takes_extra=True)

    s = sub.add_parser(
        "simulate",
        help="time a schedule without MPI (discrete events)",
        description="Time a schedule by discrete-event simulation (no MPI): makespan, "
        "bubble fraction and the closed form, in model units (tau).",
    )
    s.add_argument(
        "schedule",
        help="the schedule (a registered name or package.module:builder)",
        **_schedule_argument(),
    )
    s.add_argument("--stages", type=int, default=4, help="pipeline stages S (default 4)")
    s.add_argument("--items", type=int, default=8, help="work items n per call (default 8)")
    s.add_argument(
        "--t-forward", type=float, default=1.0, help="cost of a forward action (default 1)"
    )
    s.add_argument(
        "--t-backward", type=float, default=1.0, help="cost of a backward action (default 1)"
    )
    s.add_argument("--message", type=float, default=0.0, help="cost of every message (default 0)")
    s.add_argument("--plot", metavar="PNG", help="draw the Gantt chart to this file")
    s.add_argument("--force", action="store_true", help="replace an existing HDF5 file at --plot")
    s.set_defaults(func=cmd_simulate)

    s = sub.add_parser("trace", help="a result's timeline as Chrome trace JSON (Perfetto)")
    s.add_argument("result", help="HDF5 result file")
    s.add_argument("-o", "--output", required=True, help="JSON file to write")
    s.add_argument("--iteration", type=int, default=None, help="only this iteration")
    s.add_argument("--force", action="store_true", help="replace an existing HDF5 file at -o")
    s.set_defaults(func=cmd_trace)

    s = sub.add_parser(
        "export",
        help="a result's tables as CSV or Parquet files",
        description="Write a result's iterations, timeline and stages tables (columns in "
        "the order of docs/results.md) and its attributes (JSON), for tools outside Python.",
    )
    s.add_argument("result", help="HDF5 result file")
    s.add_argument(
        "--format", choices=["csv", "parquet"], default="csv", help="csv (default) or parquet"
    )
    s.add_argument(
        "-o",
        "--output",
        metavar="PREFIX",
        help="write PREFIX-iterations.csv, ... (default: the result's path without .h5)",
    )
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("plot", help="pictures of a result")
    s.add_argument("what", choices=["timeline"], help="timeline: Gantt chart of an iteration")
    s.add_argument("result", help="HDF5 result file")
    s.add_argument("-o", "--output", required=True, help="PNG file to write")
    s.add_argument("--iteration", type=int, default=None, help="default: the last recorded")
    s.add_argument("--force", action="store_true", help="replace an existing HDF5 file at -o")
    s.set_defaults(func=cmd_plot)

    s = sub.add_parser("bench", help="benchmark cases that print figures")
    s.add_argument("case", choices=["pipeline", "dense", "transport", "simulate", "study", "peer"])
    s.add_argument("--port", type=int, default=29517, help="peer: gloo rendezvous port")
    s.add_argument("--width", default="64", help="dense: comma-separated widths")
    s.add_argument("--mb", default="8", help="dense: rows per microbatch")
    s.add_argument("--micro", default="16", help="dense: microbatches M")
    s.add_argument("--np", type=_ranks_option, default=0, help="ranks (pipeline 4, transport 2)")
    s.add_argument("--max-bytes", type=int, default=4 << 20, help="transport: largest size")
    s.add_argument("--min-bytes", type=int, default=8, help="transport: smallest size")
    s.add_argument("--iters", type=int, default=1000, help="transport: round trips per block")
    s.add_argument(
        "--wait",
        default="auto",
        choices=["busy", "yield", "sleep", "auto"],
        help="transport, pipeline: wait policy (auto: busy when ranks <= cores, else yield)",
    )
    s.add_argument(
        "--depth",
        default="",
        help="pipeline: comma-separated depths (>= ranks; default ranks); study: "
        "depths = stages (default 64,512,4096)",
    )
    s.add_argument("--samples", default="16", help="comma-separated K (study: the first)")
    s.add_argument("--layer-time", type=float, default=0.01, help="seconds per layer")
    s.add_argument("--schedules", default="gpipe,1f1b")
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--spin", action="store_true", help="spin instead of sleep")
    s.set_defaults(func=cmd_bench, takes_extra=True)

    s = sub.add_parser("info", help="versions of hpcpipe, numpy, mpi4py, h5py and the MPI library")
    s.set_defaults(func=cmd_info)
    return p


COMMAND = "HPCPIPE_COMMAND"


def typed_command(argv: list[str]) -> str:
    """The command as the user typed it (``hpcpipe ...`` or ``python -m hpcpipe ...``)."""
    import shlex

    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "hpcpipe"
    words = ["hpcpipe"] if prog == "hpcpipe" else ["python", "-m", "hpcpipe"]
    return shlex.join([*words, *argv])


def main(argv: list[str] | None = None) -> int:
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    if not os.environ.get(INSIDE):  # the relaunched ranks inherit it; results store it
        os.environ[COMMAND] = typed_command(argv)
    args, extra = build_parser().parse_known_args(argv)
    if getattr(args, "takes_extra", False):
        return args.func(args, extra, argv)
    if extra:
        raise SystemExit(f"hpcpipe {args.command}: unrecognised arguments {' '.join(extra)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
