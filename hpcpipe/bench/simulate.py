"""``hpcpipe bench simulate``: simulator throughput in actions per second (one core, no MPI)."""

from __future__ import annotations

from hpcpipe.bench.common import header, median, write_record
from hpcpipe.run.table import table


def bench_simulate(
    repeats: int = 5,
    stages: int = 1024,
    items: int = 1024,
    big: int = 4096,
    big_repeats: int = 3,
    query: tuple[int, int] = (4096, 10_000),
) -> int:
    """Median time to simulate each registered built-in schedule, with random costs.

    Three sizes: S = n = ``stages`` (throughput in M actions/s, the goal being
    >= 10), S = n = ``big`` (the goal being <= 5 s), and one makespan query of
    ``query`` = (S, n), the size a simulated-executor study asks for. The
    kernel that ran is printed beside each figure, and both the wall time and
    this process's CPU time (the wall time on a shared machine also counts
    waiting for a core), for one ``simulate`` call: the schedule is built
    before the clocks start, and its build time is a column of its own. S is
    the rank count a builder is given (interleaved
    and V schedules make more stages). Schedules without a kernel of their
    own (the generic ``rounds``: placed or split-backward ones) are measured
    at S = n = ``stages`` only: at ``big`` their lists alone take gigabytes.
    """
    from hpcpipe.pipeline.schedules import builtin_names
    from hpcpipe.pipeline.simulator import throughput

    names = builtin_names()  # not a schedule a user (or a test) registered
    what = (
        f"simulator, random per-stage and per-message costs; S = n = {stages} and "
        f"S = n = {big} (median of {repeats} and {big_repeats}), query S = {query[0]}, "
        f"n = {query[1]} (one run). Timed: one simulate() call on a freshly built "
        "schedule, everything it does (cost checks, kernel choice, the kernel's tables, "
        "the result); building the schedule is not in it (its wall time: build (s))"
    )
    header(None, what)
    rows = []
    own_kernel = ("sequential", "gpipe", "1f1b")
    sizes = ((stages, items, repeats), (big, big, big_repeats), (*query, 1))
    for row, (S, n, reps) in enumerate(sizes):
        for name in names:
            if row > 0 and name not in own_kernel:
                continue
            runs = [throughput(S, n, name, seed=r) for r in range(reps)]
            wall, cpu = median(r[1] for r in runs), median(r[2] for r in runs)
            acts, kernel, build = runs[0][0], runs[0][3], median(r[4] for r in runs)
            rows.append(
                [name, S, n, acts, kernel, wall, cpu, acts / wall / 1e6, acts / cpu / 1e6, build]
            )
    head = ["schedule", "S", "n", "actions", "kernel", "wall (s)", "cpu (s)"]
    head += ["M actions/s (wall)", "M actions/s (cpu)", "build (s)"]
    print(table(head, rows))
    sane = all(r[5] > 0 and r[6] > 0 for r in rows)
    return 0 if write_record("simulate", head, rows, sane=sane, what=what) is not False else 1
