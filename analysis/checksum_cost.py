"""The cost of the Fletcher-32 checksums in result files: write time and file size.

    python analysis/checksum_cost.py --pairs 7 --flushes 300

The same writes are made with the filter on and off (``hpcpipe.run.results.SUM``), in
pairs whose order alternates, through the result writer: per flush 10 rows, 80 timeline
events and a crash-consistent save of a two-array optimizer state of d values (d = 4096
by default). Each file's time runs from its creation to its close (``perf_counter``). The
ratio with / without is taken per pair (the two runs of a pair meet nearly the same
machine load) and given as min / median / max, with the load average at start and end.
Run it on an idle machine: the times depend on the load, the sizes do not.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from hpcpipe.run import results
from hpcpipe.run.runner import COLUMNS


def write_one(path: str, checksum: bool, d: int, flushes: int, seed: int) -> tuple[float, int]:
    """(seconds, bytes) of one result file written with or without the checksums."""
    rng = np.random.default_rng(seed)
    saved = results.SUM
    results.SUM = {"fletcher32": True} if checksum else {}
    try:
        t0 = time.perf_counter()
        layout = (("theta", "prev"), ("t",))
        with results.Writer(
            path, {"config": "{}"}, COLUMNS, 2, state_size=d, state_layout=layout
        ) as w:
            for k in range(flushes):
                w.append_iterations(rng.standard_normal((10, len(COLUMNS))))
                ev = rng.standard_normal((80, 8))
                ev[:, :5] = np.abs(ev[:, :5]).round()
                w.append_timeline(ev)
                w.flush()
                state = {"theta": rng.standard_normal(d), "prev": rng.standard_normal(d)}
                w.save_state(state, [float(k)], [k + 1.0, 0.0, 0.0, 0.0], np.zeros((2, 4)))
            w.close("complete")
        return time.perf_counter() - t0, os.path.getsize(path)
    finally:
        results.SUM = saved


def spread(v: list[float]) -> str:
    return f"min {min(v):.3f} / median {float(np.median(v)):.3f} / max {max(v):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--flushes", type=int, default=300)
    ap.add_argument("--dim", type=int, default=4096)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    on, off, ratio, sizes = [], [], [], (0, 0)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            got = {}
            for checksum in (True, False) if i % 2 == 0 else (False, True):
                path = os.path.join(tmp, f"{i}-{int(checksum)}.h5")
                got[checksum] = write_one(path, checksum, a.dim, a.flushes, seed=i)
            on.append(got[True][0])
            off.append(got[False][0])
            ratio.append(got[True][0] / got[False][0])
            sizes = (got[True][1], got[False][1])
            print(f"pair {i}: with {on[-1]:.3f} s, without {off[-1]:.3f} s", flush=True)
    print(f"{a.pairs} pairs, {a.flushes} flushes, d = {a.dim}, load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"with Fletcher-32: {spread(on)} s; without: {spread(off)} s")
    print(f"time ratio with / without, per pair: {spread(ratio)}")
    print(
        f"file size with {sizes[0]} B, without {sizes[1]} B "
        f"({100 * (sizes[0] / sizes[1] - 1):+.2f}%)"
    )


if __name__ == "__main__":
    main()
