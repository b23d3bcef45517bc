"""Sweeps: a grid of run configurations, one HDF5 file per point.

A sweep file (TOML) has

    [sweep]  name, out (directory), ranks (an int, or "depth": a point asks for Δ ranks)
    [base]   settings shared by every point (any run key)
    [grid]   key = [values, ...]: the cartesian product of these
    [[cases]] optional list of tables, each a labelled set of settings (label = "...");
             the points are cases × grid

Point i writes ``<out>/<i:04d>-<label>.h5``. Running a sweep skips points
whose file is complete (or diverged: that is a result), resumes points left
incomplete, and runs the rest; so re-running a sweep (or re-submitting a
Slurm array) finishes what is missing. Locally all points run inside one
``mpiexec`` launch, each on a sub-communicator of the ranks it needs; idle
ranks wait without spinning. A launch with room for several of the largest
point (``--np``) runs points side by side, one per group of ranks (``run_points``).
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.run.config import ConfigError, RunConfig, check_path, make_config, tomllib, validate


@dataclass
class Point:
    index: int
    label: str
    values: dict
    path: Path
    ranks: int

    def config(self) -> RunConfig:
        return make_config({**self.values, "output": ""})


@dataclass
class Sweep:
    name: str
    out: Path
    points: list[Point]
    source: str

    @property
    def max_ranks(self) -> int:
        return max(p.ranks for p in self.points)


# The sweep-file schema: its tables and the keys of [sweep], with their meaning (the docs'
# sweep-file page is generated from these).
TABLES = {
    "sweep": "the sweep's name, results folder and ranks per point (keys below)",
    "base": "settings shared by every point: any run setting",
    "grid": "key = [values, ...]: the points are the cartesian product of these lists",
    "cases": "optional [[cases]] tables, each a set of settings with a label; "
    "the points are cases × grid",
}
SWEEP_KEYS = {
    "name": "the sweep's name (default: the file's stem): letters, digits, _ . -, "
    "at most 64, starting with a letter or digit",
    "out": "results folder (default results/<name>; --out overrides it)",
    "ranks": 'ranks per point: a whole number >= 1 (default 1), or "depth": '
    "a point asks for as many ranks as its depth",
}
_SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_LABEL = 120  # bytes of a point's label in its file name (file systems allow 255)


def _slug(v) -> str:
    """A file-name-safe form of a label or grid value: no separators, no dot-only names."""
    text = re.sub(r"[^A-Za-z0-9.+=-]", "_", str(v))
    return re.sub(r"\.{2,}", "_", text)


def _label(parts: list[str]) -> str:
    label = "-".join(parts) or "point"
    if len(label) > MAX_LABEL:  # keep it unique: a digest of the whole label
        digest = hashlib.sha256(label.encode()).hexdigest()[:10]
        label = f"{label[: MAX_LABEL - 11]}~{digest}"
    return label


def _ranks(value, name: str) -> int | str:
    """[sweep] ranks: a whole number >= 1, or "depth"."""
    if value == "depth":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ConfigError(
            f"sweep {name}: ranks = {value!r} is not allowed: "
            'write a whole number >= 1 (e.g. ranks = 4) or ranks = "depth"'
        )
    return value


def _head(data: dict, path) -> dict:
    head = data.get("sweep", {})
    if not isinstance(head, dict):
        raise ConfigError(f"sweep file {path}: [sweep] must be a table")
    for key in head:
        if key not in SWEEP_KEYS:
            close = difflib.get_close_matches(key, SWEEP_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"sweep file {path}: unknown key sweep.{key}{hint}; "
                f"[sweep] has {', '.join(SWEEP_KEYS)}"
            )
    return head


def load_sweep(path: str | Path, out: str | None = None, profiles: bool = True) -> Sweep:
    """Read and validate every point of a sweep file (ConfigError naming the point);
    ``profiles`` False validates all but the machine profiles the points name (a Slurm
    folder whose jobs calibrate them first: ``studies.jobs``)."""
    check_path("sweep file", str(path), write=False)
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"sweep file {str(path)!r} is not valid TOML: {e}") from None
    unknown = set(data) - set(TABLES)
    if unknown:
        raise ConfigError(
            f"sweep file {path}: unknown table(s) {sorted(unknown)}; "
            "use [sweep], [base], [grid], [[cases]]"
        )
    head = _head(data, path)
    name = head.get("name", p.stem)
    if not isinstance(name, str) or not _SWEEP_NAME.fullmatch(name):
        raise ConfigError(
            f"sweep file {path}: name = {name!r} is not allowed: "
            "letters, digits, _ . - (at most 64, starting with a letter or digit)"
        )
    outdir = out or head.get("out", f"results/{name}")
    if not isinstance(outdir, str) or not outdir or "\0" in outdir:
        raise ConfigError(f"sweep file {path}: out = {outdir!r} must be a folder path")
    check_path("--out" if out else f"sweep file {path}: out", outdir, write=True)
    outdir = Path(outdir)
    ranks = _ranks(head.get("ranks", 1), name)
    base = data.get("base", {})
    grid = data.get("grid", {})
    if not isinstance(base, dict) or not isinstance(grid, dict):
        raise ConfigError(f"sweep file {path}: [base] and [grid] must be tables")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"sweep file {path}: grid.{k} must be a non-empty list")
    cases = data.get("cases", [{}])
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases) or not cases:
        raise ConfigError(f"sweep file {path}: cases must be [[cases]] tables")
    keys = list(grid)
    points = []
    for ci, case in enumerate(cases):
        case = dict(case)
        clabel = _slug(case.pop("label", "" if len(cases) == 1 else f"case{ci}"))
        for combo in itertools.product(*(grid[k] for k in keys)):
            values = {**base, **case, **dict(zip(keys, combo))}
            idx = len(points)
            parts = ([clabel] if clabel else []) + [f"{k}={_slug(v)}" for k, v in zip(keys, combo)]
            label = _label(parts)
            try:
                cfg = make_config({**values, "output": ""}, check_profile=profiles)
                n = cfg.depth if ranks == "depth" else ranks
                validate(cfg, n, check_output=False, check_profile=profiles)
            except (ConfigError, ValueError) as e:
                msg, prof = str(e), values.get("machine")
                if msg.startswith(f"machine = {prof!r}: no such file"):  # made by calibrate
                    msg = (
                        f"machine = {prof!r}: no such file; calibrate the profiles the sweep "
                        f"names first: hpcpipe calibrate --sweep {path}"
                    )
                raise ConfigError(f"sweep {name}, point {idx} ({label}): {msg}") from None
            file = outdir / f"{idx:04d}-{label}.h5"
            if file.parent != outdir or file.name in (".", ".."):  # cannot happen after _slug
                raise ConfigError(f"sweep {name}, point {idx}: label {label!r} leaves {outdir}")
            points.append(Point(idx, label, values, file, n))
    if not points:
        raise ConfigError(f"sweep file {path}: no points")
    return Sweep(name, outdir, points, str(p))


def point_state(pt: Point) -> str:
    """'missing', 'running' (its writer holds the lock), 'complete', 'diverged',
    'failed', 'incomplete' or 'unreadable' for a point's file."""
    from hpcpipe.run.results import ResultsError, is_locked, load

    if not pt.path.exists():
        return "missing"
    if is_locked(pt.path):
        return "running"
    try:
        return load(pt.path).status
    except ResultsError:
        return "running" if is_locked(pt.path) else "unreadable"


def _resumable_state(pt: Point, log) -> str:
    """``point_state``, after repairing a file whose writer was killed while it grew
    (``results.recover_truncated``: only with its lock free, said in one line)."""
    from hpcpipe.run.results import ResultsError, recover_truncated

    state = point_state(pt)
    if state == "unreadable":
        try:
            if recover_truncated(pt.path, log=log):
                state = point_state(pt)
        except ResultsError:  # its lock was taken meanwhile: a live writer
            state = "running"
    return state


LOCK_NAME = ".hpcpipe-sweep.lock"


class SweepLock:
    """A ``flock`` on ``<out>/.hpcpipe-sweep.lock``: exclusive for a whole sweep, shared for
    ``--point`` tasks (Slurm array tasks of one sweep run side by side), so two sweeps on
    one folder do not interleave. The kernel drops it when its holder dies."""

    def __init__(self, out: Path, shared: bool):
        import fcntl

        from hpcpipe.run import atomic

        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LOCK_NAME
        atomic.check_injected(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise ConfigError(
                f"results folder {str(out)!r} is in use by another sweep (lock {self.path} "
                "is held): wait for it to finish, or choose another --out"
            ) from None

    def release(self) -> None:
        os.close(self.fd)


def write_grid(sweep: Sweep) -> Path:
    """The resolved grid as JSON next to the results (and the job scripts), written whole
    or not at all (``atomic``)."""
    from hpcpipe.run import atomic

    sweep.out.mkdir(parents=True, exist_ok=True)
    path = sweep.out / "grid.json"
    atomic.write_text(
        path,
        json.dumps(
            {
                "name": sweep.name,
                "source": sweep.source,
                "points": [
                    {
                        "index": p.index,
                        "label": p.label,
                        "ranks": p.ranks,
                        "file": p.path.name,
                        "config": p.values,
                    }
                    for p in sweep.points
                ],
            },
            indent=1,
            default=str,
        ),
    )
    return path


def _idle_barrier(comm) -> None:
    """A barrier that sleeps while it waits, so idle oversubscribed ranks do not spin."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def _count_sum(counts: list[dict]) -> dict:
    """The counts of several groups (``run_points``) added up."""
    total = {"ran": 0, "resumed": 0, "skipped": 0, "stopped": False}
    for c in counts:
        for k in ("ran", "resumed", "skipped"):
            total[k] += c[k]
        total["stopped"] = total["stopped"] or c["stopped"]
    return total


def deal(todo: list[Point], groups: int) -> list[list[Point]]:
    """The points of each of ``groups`` groups: dealt in order, like cards (point k of the
    list to group k mod groups). Neighbouring points of a grid differ in its last key only,
    so each group gets about the same share of every case and every value of the other
    keys, and so about the same run time; the deal depends on nothing but the list."""
    return [todo[g::groups] for g in range(groups)]


def run_points(
    comm,
    sweep: Sweep,
    indices: list[int] | None = None,
    log=print,
    stop=None,
    seen: dict[int, str] | None = None,
) -> dict:
    """Run the selected points (all by default) on this communicator; returns counts.
    ``seen`` (a dict) receives, on rank 0, the state of each point handled: the status its
    run ended with, or the state it was skipped in (``point_state``'s words), so the sweep's
    tally reads no file again.

    When the communicator has room for several copies of the largest selected point
    (``hpcpipe sweep --np N``), it is split into groups of that many ranks (the ranks past
    the last whole group wait) and the points still to run are dealt out to the groups
    (``deal``), which run their points side by side, each as a one-group sweep would. A
    point's file is the same whichever group runs it: a run depends only on its settings
    and its rank count. Rank 0 first skips the points already finished (one line each).

    ``stop`` (a ``StopFlag``, or None) is raised by SIGTERM / SIGINT between points, or
    on a rank that waits while others run a point: the sweep then starts no other point
    (``counts["stopped"]``; with groups, each group stops when its ranks see the signal,
    which ``mpiexec`` forwards to every rank). A signal during a point stops that point's
    run at the end of its iteration, its file flushed and left incomplete, and the sweep
    with it.
    """
    from mpi4py import MPI

    todo = [sweep.points[i] for i in (indices if indices is not None else range(len(sweep.points)))]
    width = max((pt.ranks for pt in todo), default=1)
    groups = comm.size // width
    seen = {} if seen is None else seen
    if groups <= 1 or len(todo) <= 1:
        return _run_in_turn(comm, sweep, todo, log, stop, seen)
    if comm.allreduce(int(stop is not None and stop.raised), op=MPI.MAX):
        return _count_sum([{"ran": 0, "resumed": 0, "skipped": 0, "stopped": True}])
    pending = None
    skipped = 0
    if comm.rank == 0:  # the finished points are skipped here, so the deal is of real work
        pending = []
        for pt in todo:
            said = lambda m, pt=pt: log(f"[{sweep.name}] point {pt.index} {pt.label}: {m}")  # noqa: E731
            state = _resumable_state(pt, said)
            if state in ("missing", "incomplete"):
                pending.append(pt.index)
            else:
                skipped += 1
                seen[pt.index] = state
                log(f"[{sweep.name}] point {pt.index} {pt.label}: skipped ({_why(state)})")
    pending = comm.bcast(pending, root=0)
    dealt = deal([sweep.points[i] for i in pending], groups)
    color = comm.rank // width if comm.rank < groups * width else MPI.UNDEFINED
    group = comm.Split(color, comm.rank)
    mine = {"ran": 0, "resumed": 0, "skipped": 0, "stopped": False}
    ours: dict[int, str] = {}
    if group != MPI.COMM_NULL:
        try:
            mine = _run_in_turn(group, sweep, dealt[color], log, stop, ours)
        finally:
            leader = group.rank == 0
            group.Free()
    else:
        leader = False
    _idle_barrier(comm)
    every = [c for c in comm.allgather((mine, ours) if leader else None) if c is not None]
    total = _count_sum([c for c, _ in every])
    if comm.rank == 0:
        for _, theirs in every:
            seen.update(theirs)
    total["skipped"] += comm.bcast(skipped, root=0)
    return total


def _why(state: str) -> str:
    return {
        "unreadable": "unreadable file, left as it is",
        "running": "another process is writing its file",
    }.get(state, state)


def _run_in_turn(comm, sweep: Sweep, todo: list[Point], log, stop, seen: dict) -> dict:
    """Run these points one after the other on this communicator (``run_points``); each
    on its first ``ranks`` ranks while the others wait without spinning."""
    from mpi4py import MPI

    from hpcpipe.run.runner import run

    counts = {"ran": 0, "resumed": 0, "skipped": 0, "stopped": False}
    for pt in todo:
        if comm.allreduce(int(stop is not None and stop.raised), op=MPI.MAX):
            counts["stopped"] = True
            break
        said = lambda m, pt=pt: log(f"[{sweep.name}] point {pt.index} {pt.label}: {m}")  # noqa: E731
        state = comm.bcast(_resumable_state(pt, said) if comm.rank == 0 else None, root=0)
        if state in ("complete", "diverged", "failed", "unreadable", "running"):
            counts["skipped"] += 1
            seen[pt.index] = state
            if comm.rank == 0:
                log(f"[{sweep.name}] point {pt.index} {pt.label}: skipped ({_why(state)})")
            continue
        if pt.ranks > comm.size:
            raise ConfigError(f"point {pt.index} needs {pt.ranks} ranks, the job has {comm.size}")
        if comm.rank == 0:
            pt.path.parent.mkdir(parents=True, exist_ok=True)
        sub = comm.Split(0 if comm.rank < pt.ranks else MPI.UNDEFINED, comm.rank)
        t0 = time.perf_counter()
        status = None
        if sub != MPI.COMM_NULL:
            cfg = make_config({**pt.values, "output": str(pt.path) if state == "missing" else ""})
            if state == "incomplete":
                import dataclasses

                cfg = dataclasses.replace(cfg, output=str(pt.path))
            res = run(
                cfg,
                sub,
                label=f"point {pt.index}",
                resume=str(pt.path) if state == "incomplete" else None,
            )
            status = res.status
            sub.Free()
        _idle_barrier(comm)
        status = comm.bcast(status, root=0)
        counts["resumed" if state == "incomplete" else "ran"] += 1
        seen[pt.index] = status
        if comm.rank == 0:
            log(
                f"[{sweep.name}] point {pt.index} {pt.label}: {status} "
                f"({time.perf_counter() - t0:.1f} s, {pt.ranks} ranks) -> {pt.path}"
            )
        if status == "incomplete":  # a signal stopped it: stop the sweep too
            counts["stopped"] = True
            break
    return counts


def main_inside(comm, path: str, out: str | None, indices: list[int] | None) -> int:
    sweep = load_sweep(path, out)
    lock, err = None, None
    if comm.rank == 0:
        try:
            lock = SweepLock(sweep.out, shared=indices is not None)
            write_grid(sweep)
        except ConfigError as e:
            err = str(e)
        except OSError as e:  # a full disk, a folder that cannot be written: one line
            from hpcpipe.cli.failures import describe

            err = describe(e)
    err = comm.bcast(err, root=0)
    if err:
        if comm.rank == 0:
            print(f"hpcpipe: {err}", file=sys.stderr, flush=True)
        return 2
    from hpcpipe.run.progress import StopFlag

    seen: dict[int, str] = {}
    try:  # SIGTERM / SIGINT (scancel, a time limit, Ctrl-C) stop the sweep, never a rank
        with StopFlag() as stop:
            say = lambda m: print(m, flush=True)  # noqa: E731
            counts = run_points(comm, sweep, indices, log=say, stop=stop, seen=seen)
    finally:
        if lock is not None:
            lock.release()
    if comm.rank == 0:
        mine = indices if indices is not None else range(len(sweep.points))
        # never others' files; a point this launch ran or skipped is not read again (a
        # thousand files of a long sweep took rank 0 50 s, the other ranks waiting)
        states = {i: seen[i] if i in seen else point_state(sweep.points[i]) for i in mine}
        done = sum(s in ("complete", "diverged") for s in states.values())
        print(
            f"[{sweep.name}] {counts['ran']} ran, {counts['resumed']} resumed, "
            f"{counts['skipped']} skipped; {done}/{len(states)} points finished "
            f"in {sweep.out}",
            flush=True,
        )
        if counts["stopped"]:
            print(
                f"[{sweep.name}] stopped by a signal: files flushed, an interrupted point left "
                "incomplete; run the sweep again to resume it",
                flush=True,
            )
        if indices is not None:
            return 143 if any(states[i] == "incomplete" for i in indices) else 0
        return 0 if done == len(states) else 143
    return 0


def describe(sweep: Sweep, stream=None) -> None:
    from hpcpipe.run.results import ResultsError, load

    stream = stream or sys.stdout
    for p in sweep.points:
        state = point_state(p)
        why = ""
        if state == "unreadable":
            try:
                load(p.path)
            except ResultsError as e:
                why = f"  ({e})"
        print(f"{p.index:4d}  ranks {p.ranks:3d}  {state:10s}  {p.path}{why}", file=stream)
