"""``hpcpipe bench study``: the cost of one oracle call of the simulated pipeline.

A depth study at scale runs the ``simulated`` executor (one process; the
numbers of the MPI engine, the time from the schedule simulator): each call
costs its numerics (K perturbed inputs through Δ blocks and back) plus, on
the first call of a configuration, the simulation of the schedule (cached
afterwards). This case measures both at Δ = S in ``depths``: an orthogonal
chain of width d with the l1 head (the depth study's problem), m = 1, K
samples, γ > 0, GPipe. ``timing`` is the simulator's time for the call
(cache cleared before each repeat); ``numerics`` the call with the timing
cached, with the chain fused into one matrix (the executor's default for an
orthogonal chain) and layer by layer. Sanity: fused and layered give the same
loss and gradient (<= 1e-12) and the same pipeline time.
"""

from __future__ import annotations

import time

import numpy as np

from hpcpipe.bench.common import columns_rows, figures, header, median, write_record
from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.simulated import SimulatedPipeline, clear_timings, schedule_timing
from hpcpipe.pipeline.simulator import stage_times


def _timed(f, repeats: int) -> tuple[float, object]:
    out, ts = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        ts.append(time.perf_counter() - t0)
    return median(ts), out


def study_row(depth: int, width: int, K: int, repeats: int, schedule: str = "gpipe") -> dict:
    spec = ModelSpec("orthogonal", depth=depth, d_in=width, d_out=width, head="abs", seed=1)
    batch = random_batch(spec, 1)
    costs = CostModel.uniform(depth, 1.0, 1.0)
    t0 = time.perf_counter()
    pipes = {
        f: SimulatedPipeline(spec, batch, "input", schedule, samples=K, costs=costs, fused=f)
        for f in ("auto", "off")
    }
    build = time.perf_counter() - t0
    point = pipes["auto"].initial_point() + 0.01

    tf, tb = stage_times(costs, depth, depth)
    free = [[0.0] * K] * (depth - 1)  # α = β = 0: messages cost nothing

    def timing():
        clear_timings()
        return schedule_timing(pipes["auto"].schedule, tf, tb, free).makespan

    t_timing, makespan = _timed(timing, repeats)
    t_fused, r_fused = _timed(lambda: pipes["auto"].evaluate(point, 0.01, 3), repeats)
    t_layer, r_layer = _timed(lambda: pipes["off"].evaluate(point, 0.01, 3), repeats)
    scale = max(np.abs(r_layer.grad).max(), 1e-300)
    err = float(np.abs(r_fused.grad - r_layer.grad).max() / scale)
    sane = (
        err <= 1e-12
        and abs(r_fused.loss - r_layer.loss) <= 1e-12 * max(abs(r_layer.loss), 1.0)
        and r_fused.time == r_layer.time == makespan
    )
    return {
        "depth": depth,
        "K": K,
        "d": width,
        "actions": len(pipes["auto"].schedule),
        "build_s": build,
        "timing_ms": t_timing * 1e3,
        "fused_ms": t_fused * 1e3,
        "layered_ms": t_layer * 1e3,
        "first_call_ms": (t_timing + t_fused) * 1e3,
        "timing_share": t_timing / (t_timing + t_fused),
        "makespan": makespan,
        "grad_err": err,
        "sane": sane,
    }


COLUMNS = [
    ("depth", "Delta = S"),
    ("K", "K"),
    ("d", "d"),
    ("actions", "actions"),
    ("build_s", "build (s)"),
    ("timing_ms", "timing (ms)"),
    ("fused_ms", "numerics fused (ms)"),
    ("layered_ms", "numerics layered (ms)"),
    ("first_call_ms", "first call (ms)"),
    ("timing_share", "timing share"),
    ("makespan", "pipeline time (tau)"),
    ("grad_err", "fused vs layered"),
]


def bench_study(depths, width: int, K: int, repeats: int) -> int:
    rows = [study_row(dp, width, K, repeats) for dp in depths]
    what = (
        f"one oracle call of the simulated pipeline (GPipe, S = Delta, m = 1, gamma = 0.01, "
        f"t_F = t_B = 1 per block), median of {repeats}; timing = schedule simulation "
        "(first call of a configuration; cached after), numerics = the call with the timing "
        "cached; build = constructing both executors (layers, schedule)"
    )
    header(None, what)
    print(figures(COLUMNS, rows))
    ok = all(r["sane"] for r in rows)
    print(
        "sanity: "
        + (
            "ok (fused = layered <= 1e-12, same pipeline time)"
            if ok
            else "FAILED (fused and layered calls differ)"
        )
    )
    written = write_record("study", *columns_rows(COLUMNS, rows), sane=ok, what=what)
    return 0 if ok and written is not False else 1
