"""``hpcpipe bench simulate``: simulator throughput in actions per second (one core, no MPI)."""

from __future__ import annotations

from hpcpipe.bench.common import header, median
from hpcpipe.run.table import table


def bench_simulate(repeats: int = 3, stages: int = 1024, items: int = 1024) -> int:
    """Median wall time of timing one schedule of S stages x n items, per schedule."""
    from hpcpipe.pipeline.simulator import throughput

    header(None, f"simulator throughput, S = {stages}, n = {items}, median of {repeats}")
    rows = []
    for name in ("sequential", "gpipe", "1f1b"):
        runs = [throughput(stages, items, name) for _ in range(repeats)]
        n = runs[0][0]
        t = median(r[1] for r in runs)
        rows.append([name, stages, items, n, t, n / t / 1e6])
    print(table(["schedule", "S", "n", "actions", "median (s)", "M actions/s"], rows))
    return 0
