"""What every benchmark case shares: the header, paired timing, the figure table.

A case (in the style of ReFrame / OSU) is named, runs a sanity check and
prints performance figures with their units. Every case starts with the same
header: the command, the machine (host, architecture, usable cores, load
average), the ranks and MPI library, and the versions of Python, numpy and
mpi4py. Figures are medians over repeats; a ratio of two ways of doing the
same work comes from one run in which the two sides were timed in turn
(A B, B A, A B, ...), so both see the same machine state.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from hpcpipe.run.table import table


def cores() -> int:
    """Cores this process may run on."""
    aff = getattr(os, "sched_getaffinity", None)
    return len(aff(0)) if aff else (os.cpu_count() or 1)


def mpi_library() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip()


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


def finish(comm, columns: list[tuple[str, str]], rows: list[dict]) -> int:
    """Rank 0 prints the figures and the sanity line; exit status 1 when a row is not sane."""
    if comm.rank != 0:
        return 0
    print(figures(columns, rows))
    ok = all(r["sane"] for r in rows)
    print("sanity: " + ("ok" if ok else "FAILED (non-finite or zero times)"))
    return 0 if ok else 1


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
