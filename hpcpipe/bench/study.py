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

The O(d) layers (``layers = "householder"``) are measured at the scale they
exist for, Δ = 4096 and d = 4096 by default (``householder_row``): the first
call of a configuration (drawing the chain's rΔ reflectors, their WY panels,
the schedule's timing and the numerics), the later calls (median), and the
memory: the chain's bytes beside what Δ dense d×d layers would take, and the
process's peak resident memory. Sanity: the fused call equals the call layer
by layer (<= 1e-12) with the same pipeline time.
"""

from __future__ import annotations

import resource
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


def householder_row(depth: int, width: int, K: int, repeats: int) -> dict:
    """First call, later calls and memory of the fused O(d) chain (module docstring), on one
    BLAS thread: the panels' products are small, and on a loaded machine a second BLAS
    thread that spins while waiting made the case over ten times slower (measured)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _householder_row(depth, width, K, repeats)


def _householder_row(depth: int, width: int, K: int, repeats: int) -> dict:
    from hpcpipe.model.reflectors import clear_reflector_chains, reflector_chain

    clear_reflector_chains()
    clear_timings()
    spec = ModelSpec("householder", depth=depth, d_in=width, d_out=width, head="abs", seed=1)
    batch = random_batch(spec, 1)
    costs = CostModel.uniform(depth, 1.0, 1.0)
    t0 = time.perf_counter()
    pipe = SimulatedPipeline(spec, batch, "input", "gpipe", samples=K, costs=costs)
    point = pipe.initial_point() + 0.01
    first = pipe.evaluate(point, 0.01, 1)
    t_first = time.perf_counter() - t0
    t_later, r_fused = _timed(lambda: pipe.evaluate(point, 0.01, 3), repeats)
    chain = reflector_chain(1, width, depth).nbytes
    layered = SimulatedPipeline(spec, batch, "input", "gpipe", samples=K, costs=costs, fused="off")
    r_layer = layered.evaluate(point, 0.01, 3)
    scale = max(np.abs(r_layer.grad).max(), 1e-300)
    err = float(np.abs(r_fused.grad - r_layer.grad).max() / scale)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {
        "depth": depth,
        "K": K,
        "d": width,
        "first_s": t_first,
        "later_ms": t_later * 1e3,
        "chain_mib": chain / 2**20,
        "dense_gib": 8 * depth * width * width / 2**30,
        "peak_mib": peak / 2**20,
        "grad_err": err,
        "sane": bool(err <= 1e-12 and r_fused.time == r_layer.time == first.time),
    }


HOUSEHOLDER_COLUMNS = [
    ("depth", "Delta = S"),
    ("K", "K"),
    ("d", "d"),
    ("first_s", "first call (s)"),
    ("later_ms", "later calls (ms)"),
    ("chain_mib", "chain (MiB)"),
    ("dense_gib", "dense layers would take (GiB)"),
    ("peak_mib", "peak RSS (MiB)"),
    ("grad_err", "fused vs layered"),
]


def bench_study(
    depths, width: int, K: int, repeats: int, householder: tuple[int, int] | None = None
) -> int:
    """The dense chain at ``depths`` (width ``width``), then, when ``householder`` = (Δ, d)
    is given, the O(d) chain at that size."""
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
    if householder is not None:
        row = householder_row(*householder, K, repeats)
        print(
            f"\nO(d) layers (layers = householder, 2 reflectors per layer, fused in WY panels), "
            f"one oracle call, later calls: median of {repeats}; first call = drawing the "
            "chain, its panels, the schedule's timing and the numerics; peak RSS of this process"
        )
        print(figures(HOUSEHOLDER_COLUMNS, [row]))
        ok = ok and row["sane"]
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
