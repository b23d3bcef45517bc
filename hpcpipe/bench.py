"""Benchmark cases: named, parameterised, with a sanity check and figures with units.

Like ReFrame / OSU cases, each prints the command, the machine, the MPI
library and its figures (medians over repeats, ratios from the same run).
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import sys

import numpy as np

from .clocks import CostModel
from .engine import Engine
from .model import ModelSpec, random_batch
from .report import table
from .schedules import build
from .simulator import simulate, stage_times


def machine_line(comm) -> str:
    from mpi4py import MPI

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"machine {socket.gethostname()} ({platform.machine()}, {cores} cores), "
        f"{comm.size} ranks, {MPI.Get_library_version().splitlines()[0].strip()}, "
        f"python {platform.python_version()}"
    )


def pipeline_case(
    comm,
    schedule: str,
    depth: int,
    K: int,
    layer_time: float,
    repeats: int,
    width: int = 16,
    spin: bool = False,
) -> dict:
    """Measured wall time of one oracle call against the model's prediction.

    Orthogonal chain of width ``width``, m = 1, n = K items, each action
    emulating ``layer_time`` seconds per layer. Prediction: the simulator
    with t_F = t_B = layer_time per layer and no message cost. Overhead per
    action: (measured − predicted) / (2(n + S − 1)), the slots on the GPipe
    critical path.
    """
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
    )
    point = eng.initial_point()
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        comm.Barrier()
        times.append(eng.evaluate(point, gamma=0.0).time)
    eng.close()
    measured = statistics.median(times[1:])
    tf, tb = stage_times(CostModel.uniform(depth, layer_time), depth, comm.size)
    predicted = simulate(build(schedule, comm.size, K), tf, tb).makespan
    slots = 2 * (K + comm.size - 1)
    return {
        "schedule": schedule,
        "depth": depth,
        "K": K,
        "layer_time_ms": layer_time * 1e3,
        "measured_ms": measured * 1e3,
        "model_ms": predicted * 1e3,
        "efficiency": predicted / measured if measured > 0 else float("nan"),
        "overhead_us_per_action": (measured - predicted) / slots * 1e6,
        "sane": all(np.isfinite(times)) and measured > 0,
    }


def bench_pipeline(
    comm, depths, samples, layer_time: float, schedules, repeats: int, spin: bool
) -> int:
    rows = []
    for sch in schedules:
        for depth in depths:
            for K in samples:
                rows.append(pipeline_case(comm, sch, depth, K, layer_time, repeats, spin=spin))
    if comm.rank == 0:
        print("command: hpcpipe " + " ".join(sys.argv[1:]))
        print(machine_line(comm))
        print(
            f"wall-clock oracle call, emulated layers ({'spin' if spin else 'sleep'}), "
            f"median of {repeats}"
        )
        keys = [
            "schedule",
            "depth",
            "K",
            "layer_time_ms",
            "measured_ms",
            "model_ms",
            "efficiency",
            "overhead_us_per_action",
        ]
        print(
            table(
                [
                    "schedule",
                    "depth",
                    "K",
                    "layer (ms)",
                    "measured (ms)",
                    "model (ms)",
                    "efficiency",
                    "overhead (us/action)",
                ],
                [[r[k] for k in keys] for r in rows],
            )
        )
        if not all(r["sane"] for r in rows):
            print("sanity check failed: non-finite or zero times")
            return 1
    return 0
