"""What every benchmark case shares: the header, paired timing, the figure table.

A case (in the style of ReFrame / OSU) is named, runs a sanity check and
prints performance figures with their units. Every case starts with the same
header: the command, the machine (host, architecture, usable cores, load
average), the ranks and MPI library, and the versions of Python, numpy and
mpi4py. Figures are medians over repeats; a ratio of two ways of doing the
same work comes from one run in which the two sides were timed in turn
(A B, B A, A B, ...), so both see the same machine state.

Every case also writes its figures as a dated JSON record (``write_record``): the
command, the machine, the versions, the load average when the case started and when it
ended, and the figure table with its headings (units included). The documentation's
benchmark page is generated from the records kept in ``docs/records/bench/``.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hpcpipe.machine.cores import cores
from hpcpipe.run.table import table

RECORDS_ENV = "HPCPIPE_BENCH_RECORDS"  # folder of the JSON records; "off": none
DEFAULT_RECORDS = "bench-records"
RECORD_SCHEMA = 1


def _load() -> list[float]:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else [float("nan")] * 3


# A case imports this module when it starts: the load average then is the record's start.
_STARTED = (time.time(), _load())


def mpi_library() -> str:
    """The MPI library's clean name (``hpcpipe.mpi_library``)."""
    from hpcpipe.mpi_library import library_name

    return library_name()


def machine_line(comm=None) -> str:
    """Host, architecture, cores, load average, ranks, MPI library and versions."""
    import mpi4py

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    ranks = f"{comm.size} ranks, {mpi_library()}, " if comm is not None else "one process, "
    return (
        f"machine {socket.gethostname()} ({platform.machine()}, {cores()} cores, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}), {ranks}"
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"mpi4py {mpi4py.__version__}"
    )


def header(comm=None, what: str = "") -> None:
    """Print the command, the machine line and what is measured (rank 0 only)."""
    if comm is not None and comm.rank != 0:
        return
    print("command: hpcpipe " + " ".join(sys.argv[1:]))
    print(machine_line(comm))
    if what:
        print(what)


def finish(comm, columns: list[tuple[str, str]], rows: list[dict], case: str, what="") -> int:
    """Rank 0 prints the figures and the sanity line and writes the record; exit status 1
    when a row is not sane or the record cannot be written."""
    if comm.rank != 0:
        return 0
    print(figures(columns, rows))
    ok = all(r["sane"] for r in rows)
    print("sanity: " + ("ok" if ok else "FAILED (non-finite or zero times)"))
    written = write_record(case, *columns_rows(columns, rows), sane=ok, comm=comm, what=what)
    return 0 if ok and written is not False else 1


def columns_rows(columns: list[tuple[str, str]], rows: list[dict]) -> tuple[list, list]:
    """(headings, rows as lists) of a figure table given as (key, heading) pairs."""
    return [h for _, h in columns], [[r[k] for k, _ in columns] for r in rows]


def _plain(x):
    """A JSON value for a figure: numpy scalars as Python numbers, NaN/inf as strings."""
    if isinstance(x, (np.integer, np.bool_)):
        x = x.item()
    if isinstance(x, np.floating):
        x = float(x)
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x if isinstance(x, (int, float, str, bool)) or x is None else str(x)


def met(goal: dict, value: float) -> bool:
    """Whether ``value`` meets a goal {"figure": heading, "at_most" or "at_least": bound}."""
    if "at_most" in goal:
        return value <= goal["at_most"]
    return value >= goal["at_least"]


def goal_text(goal: dict) -> str:
    """'step/bare <= 1.05' for {"figure": "step/bare", "at_most": 1.05}."""
    op, bound = ("<=", goal["at_most"]) if "at_most" in goal else (">=", goal["at_least"])
    return f"{goal['figure']} {op} {bound:g}"


def record(
    case: str,
    headings: list[str],
    rows: list[list],
    sane: bool,
    comm=None,
    what: str = "",
    goal: dict | None = None,
) -> dict:
    """A benchmark's dated record: command, machine, versions, load, figures, and the
    goal its figure is held to (if any)."""
    import mpi4py

    import hpcpipe

    now = time.time()
    versions = {
        "hpcpipe": hpcpipe.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mpi4py": mpi4py.__version__,
    }
    if comm is not None:
        versions["MPI"] = mpi_library()
    return {
        "schema": RECORD_SCHEMA,
        "case": case,
        "date": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        ),
        "wall_s": round(now - _STARTED[0], 3),
        "command": "hpcpipe " + " ".join(sys.argv[1:]),
        "machine": {"host": socket.gethostname(), "arch": platform.machine(), "cores": cores()},
        "ranks": f"{comm.size} ranks" if comm is not None else "one process",
        "versions": versions,
        "load_start": _STARTED[1],
        "load_end": _load(),
        "what": what,
        "headings": list(headings),
        "rows": [[_plain(x) for x in row] for row in rows],
        "sane": bool(sane),
        **({"goal": dict(goal)} if goal else {}),
    }


def write_record(
    case: str,
    headings: list[str],
    rows: list[list],
    sane: bool,
    comm=None,
    what: str = "",
    goal: dict | None = None,
) -> Path | None | bool:
    """Write the record to ``$HPCPIPE_BENCH_RECORDS`` (default ``bench-records/``) as
    ``<case>-<date>-<host>-<pid>.json`` (``-1``, ``-2``, ... when that name exists: never
    over an existing file), and say where.

    Returns the path, None when records are off (``HPCPIPE_BENCH_RECORDS=off``), or False
    (after one line on stderr naming the variable) when the folder cannot be written.
    """
    folder = os.environ.get(RECORDS_ENV, DEFAULT_RECORDS)
    if folder == "off":
        return None
    rec = record(case, headings, rows, sane, comm, what, goal)
    stamp = rec["date"].replace("-", "").replace(":", "")
    host = "".join(c if c.isalnum() or c in "-." else "_" for c in rec["machine"]["host"])
    stem = f"{case}-{stamp}-{host}-{os.getpid()}"
    path = Path(folder) / f"{stem}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):  # a record of the same second gets -1, -2, ...
            try:
                with open(path, "x") as f:
                    json.dump(rec, f, indent=1)
                    f.write("\n")
                break
            except FileExistsError:
                path = Path(folder) / f"{stem}-{n}.json"
    except OSError as e:
        print(
            f"hpcpipe bench: cannot write the record {str(path)!r}: {e.strerror or e}; set "
            f"{RECORDS_ENV} to a writable folder (or to off)",
            file=sys.stderr,
        )
        return False
    print(f"record: {path}")
    return path


def figures(columns: list[tuple[str, str]], rows: list[dict]) -> str:
    """The figure table: ``columns`` are (key, heading with unit) pairs."""
    return table([h for _, h in columns], [[r[k] for k, _ in columns] for r in rows])


def paired(
    runs: dict[str, Callable[[], object]], repeats: int, warmup: int = 1, comm=None
) -> dict[str, list[float]]:
    """Time each callable ``repeats`` times, interleaved, after ``warmup`` rounds.

    Round r runs the sides in order, or in reverse order when r is odd, so
    neither side always runs first. With ``comm`` every run starts after a
    barrier and its time is the slowest rank's. Returns seconds per side.
    """
    from mpi4py import MPI

    order = list(runs)
    times: dict[str, list[float]] = {k: [] for k in order}
    buf = np.zeros(1)
    for r in range(warmup + repeats):
        for k in order if r % 2 == 0 else order[::-1]:
            if comm is not None:
                comm.Barrier()
            t0 = time.perf_counter()
            runs[k]()
            buf[0] = time.perf_counter() - t0
            if comm is not None and comm.size > 1:
                comm.Allreduce(MPI.IN_PLACE, [buf, MPI.DOUBLE], op=MPI.MAX)
            if r >= warmup:
                times[k].append(float(buf[0]))
    return times


def median(xs) -> float:
    return float(statistics.median(xs))


def ratios(a: list[float], b: list[float]) -> float:
    """Median of the pairwise ratios a_i / b_i (pairs timed back to back)."""
    return median([x / y for x, y in zip(a, b)])
