"""``hpcpipe bench pipeline``: wall-clock oracle calls with emulated layers against the model.

Orthogonal chain, m = 1, n = K items; every action of a stage sleeps (or
spins) ``layer_time`` seconds per layer it holds, so a rank that sleeps needs
no core and S ranks can run on fewer cores. The model is the simulator with
t_F = t_B = layer_time per layer and no message cost; for GPipe with one
layer per stage its makespan is 2(K + S − 1)·t, the (K + Δ − 1) law.
Efficiency = model / measured; overhead per action = (measured − model) /
(2(K + S − 1)), the slots on the GPipe critical path.

With a machine profile (``--machine``, ``hpcpipe calibrate`` at the same
ranks, wait policy and ``layer_time``) the model is the simulator under the
profile's costs instead: each action costs the measured duration of the
emulated action plus the orthogonal layer's measured compute at the width,
and each message α + bytes·β of the run's wait policy, α fitted on a relay
of ranks waiting under that policy (its wake-up included). The per-hop
overhead that the uncalibrated model leaves out (waking a sleeping rank,
the message at that rank count, the sleep's overshoot) is then part of the
prediction; the column ``calibrated`` says which model a row used.
"""

from __future__ import annotations

import numpy as np

from hpcpipe.bench.common import finish, header, median
from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import Engine
from hpcpipe.pipeline.schedules import build
from hpcpipe.pipeline.simulator import message_costs, simulate, stage_times


def read_machine(path: str, ranks: int, wait: str, layer_time: float, spin: bool):
    """The checked profile at ``path`` for this bench (None without one); ConfigError
    naming the field when it was calibrated for other ranks, MPI, wait or layer_time."""
    if not path:
        return None
    from hpcpipe.errors import ConfigError
    from hpcpipe.machine.profile import read
    from hpcpipe.mpi_library import library_name
    from hpcpipe.pipeline.transport import Waiter

    if spin:
        raise ConfigError("--machine: a profile times sleeping actions; drop --spin")
    profile = read(path)
    library = library_name()
    profile.check_run(ranks, Waiter(wait, ranks).policy, layer_time, library)
    return profile


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
    machine=None,
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
    S, msg = comm.size, None
    if machine is None:
        tf, tb = stage_times(CostModel.uniform(depth, layer_time), depth, S)
    else:
        costs = machine.cost_model(spec, 1, policy, layer_time, stages=S)
        tf, tb = stage_times(costs, depth, S)
        msg = message_costs(costs, [width] * (S - 1), [1] * K) if S > 1 else None
    predicted = simulate(build(schedule, S, K), tf, tb, msg).makespan
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
        "calibrated": machine is not None,
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
    ("calibrated", "calibrated"),
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
    machine=None,
) -> int:
    """Every (schedule, depth, K); ``depths`` empty means depth = number of ranks."""
    depths = list(depths) or [comm.size]
    if min(depths) < comm.size:
        if comm.rank == 0:
            print(f"bench pipeline: --depth must be >= the {comm.size} ranks, got {min(depths)}")
        return 2
    rows = [
        pipeline_case(
            comm, sch, depth, K, layer_time, repeats, spin=spin, wait=wait, machine=machine
        )
        for sch in schedules
        for depth in depths
        for K in samples
    ]
    what = (
        f"wall-clock oracle call, emulated layers ({'spin' if spin else 'sleep'}), "
        f"median of {repeats}; model = simulator, "
        + (
            f"calibrated costs of {machine.path}"
            + (f" ({machine.busy_note})" if machine.busy else "")
            if machine is not None
            else "no message cost"
        )
    )
    header(comm, what)
    return finish(comm, COLUMNS, rows, "pipeline", what)
