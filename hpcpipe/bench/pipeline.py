"""``hpcpipe bench pipeline``: wall-clock oracle calls with emulated layers against the model.

Orthogonal chain, m = 1, n = K items; every action of a stage sleeps (or
spins) ``layer_time`` seconds per layer it holds, so a rank that sleeps needs
no core and S ranks can run on fewer cores. The model is the simulator with
t_F = t_B = layer_time per layer and no message cost; for GPipe with one
layer per stage its makespan is 2(K + S − 1)·t, the (K + Δ − 1) law.
Efficiency = model / measured; overhead per action = (measured − model) /
(2(K + S − 1)), the slots on the GPipe critical path.
"""

from __future__ import annotations

import numpy as np

from hpcpipe.bench.common import finish, header, median
from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import Engine
from hpcpipe.pipeline.schedules import build
from hpcpipe.pipeline.simulator import simulate, stage_times


def pipeline_case(
    comm,
    schedule: str,
    depth: int,
    K: int,
    layer_time: float,
    repeats: int,
    width: int = 16,
    spin: bool = False,
    wait: str = "auto",
) -> dict:
    """Measured wall time of one oracle call against the model's prediction."""
    spec = ModelSpec("orthogonal", depth=depth, d_in=width, d_out=width, head="squared")
    batch = random_batch(spec, 1)
    eng = Engine(
        comm,
        spec,
        batch,
        "input",
        schedule,
        samples=K,
        microbatches=1,
        clock="wall",
        layer_time=layer_time,
        spin=spin,
        wait=wait,
    )
    point = eng.initial_point()
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        comm.Barrier()
        times.append(eng.evaluate(point, gamma=0.0).time)
    policy = eng.waiter.policy
    eng.close()
    measured = median(times[1:])
    tf, tb = stage_times(CostModel.uniform(depth, layer_time), depth, comm.size)
    predicted = simulate(build(schedule, comm.size, K), tf, tb).makespan
    slots = 2 * (K + comm.size - 1)
    return {
        "schedule": schedule,
        "S": comm.size,
        "depth": depth,
        "K": K,
        "wait": policy,
        "layer_time_ms": layer_time * 1e3,
        "measured_ms": measured * 1e3,
        "model_ms": predicted * 1e3,
        "efficiency": predicted / measured if measured > 0 else float("nan"),
        "overhead_us_per_action": (measured - predicted) / slots * 1e6,
        "sane": bool(np.isfinite(times).all()) and measured > 0,
    }


COLUMNS = [
    ("schedule", "schedule"),
    ("S", "S"),
    ("depth", "depth"),
    ("K", "K"),
    ("wait", "wait"),
    ("layer_time_ms", "layer (ms)"),
    ("measured_ms", "measured (ms)"),
    ("model_ms", "model (ms)"),
    ("efficiency", "efficiency"),
    ("overhead_us_per_action", "overhead (us/action)"),
]


def bench_pipeline(
    comm,
    depths,
    samples,
    layer_time: float,
    schedules,
    repeats: int,
    spin: bool,
    wait: str = "auto",
) -> int:
    """Every (schedule, depth, K); ``depths`` empty means depth = number of ranks."""
    depths = list(depths) or [comm.size]
    if min(depths) < comm.size:
        if comm.rank == 0:
            print(f"bench pipeline: --depth must be >= the {comm.size} ranks, got {min(depths)}")
        return 2
    rows = [
        pipeline_case(comm, sch, depth, K, layer_time, repeats, spin=spin, wait=wait)
        for sch in schedules
        for depth in depths
        for K in samples
    ]
    what = (
        f"wall-clock oracle call, emulated layers ({'spin' if spin else 'sleep'}), "
        f"median of {repeats}; model = simulator, no message cost"
    )
    header(comm, what)
    return finish(comm, COLUMNS, rows, "pipeline", what)
