"""``hpcpipe bench dense``: a GPipe training step of real dense layers against a bare loop.

One dense layer y = xW + b per rank, squared-residual head ½‖y − t‖²/m on
the last rank, the weights the variable: one step is the forward and
backward of M microbatches of mb rows and the gradient summed over them.
Three sides are timed in turn in the same run: the engine with the wall
clock, the engine with timing off, and a bare loop (the same step written
directly with numpy and mpi4py). Before any time is taken the bare loop's
gradient is checked equal to the engine's (≤ 1e-12). The model is the
simulator fed with in-process per-stage compute times and the measured
one-message channel latency.
"""

from __future__ import annotations

import time

import numpy as np

from hpcpipe.bench.common import (
    columns_rows,
    figures,
    goal_text,
    header,
    median,
    met,
    paired,
    ratios,
    write_record,
)
from hpcpipe.bench.transport import channel_latency
from hpcpipe.model.layers import accumulate_outer, backward_layers, forward_layers
from hpcpipe.model.losses import SquaredResidual
from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.engine import Engine
from hpcpipe.pipeline.schedules import build
from hpcpipe.pipeline.simulator import simulate


def stage_compute(eng: Engine, rows: int, repeats: int = 50) -> tuple[float, float]:
    """Median (t_F, t_B) of this rank's stage on one microbatch, measured in-process."""
    st = eng.stage
    g = np.random.default_rng(0)
    x = g.standard_normal((rows, st.n_in))
    params = st.views(st.flat)
    grads = st.views(np.zeros(st.size))
    tgt = g.standard_normal((rows, st.n_out))
    tf, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        y, caches = forward_layers(st.layers, x, params)
        if st.is_last:
            _, dy = st.head(y, tgt, 1.0)
        t1 = time.perf_counter()
        if not st.is_last:
            dy = np.ones_like(y)
        t2 = time.perf_counter()
        backward_layers(st.layers, dy, caches, params, grads)
        t3 = time.perf_counter()
        tf.append(t1 - t0)
        tb.append(t3 - t2)
    return median(tf), median(tb)


def bare_gpipe(comm, w: np.ndarray, b: np.ndarray, x: np.ndarray, t: np.ndarray, M: int):
    """The floor to compare against: a bare numpy + mpi4py GPipe step, one dense layer per rank.

    The same computation as the engine's training step (y = xW + b, squared
    residual head ½‖y − t‖²/m on the last rank, dW = Σ xᵀdy and db = Σ dy
    over the M microbatches, the loss of each microbatch kept on the last
    rank) written as the shortest good loop:
    preallocated buffers, persistent requests (the fastest raw path of
    ``bench transport``), every receive started first, a send started after
    each action, one ``Waitall`` at the end, and the same kernels as the
    engine's dense layer and head (``accumulate_outer`` for dW, the squared
    residual head); no schedule, clock or recording, and the losses are not
    sent to the other ranks (the engine's call returns them on every rank).
    Returns a function running one step and returning (dW, db).
    """
    from mpi4py import MPI

    rank, size = comm.rank, comm.size
    rows = x.shape[0] // M
    n_in, width = w.shape
    first, last = rank == 0, rank == size - 1
    act_in = np.zeros((M, rows, n_in))  # activations received (or x on rank 0)
    grad_in = np.zeros((M, rows, width))  # gradients received from the next rank
    act_out = np.zeros((M, rows, width))
    grad_out = np.zeros((M, rows, n_in))
    gw, gb = np.zeros_like(w), np.zeros_like(b)
    inv_m = 1.0 / x.shape[0]
    D = MPI.DOUBLE
    recv_f = [] if first else [comm.Recv_init([act_in[i], D], rank - 1, 2 * i) for i in range(M)]
    recv_b = (
        [] if last else [comm.Recv_init([grad_in[i], D], rank + 1, 2 * i + 1) for i in range(M)]
    )
    send_f = [] if last else [comm.Send_init([act_out[i], D], rank + 1, 2 * i) for i in range(M)]
    send_b = (
        [] if first else [comm.Send_init([grad_out[i], D], rank - 1, 2 * i + 1) for i in range(M)]
    )
    recvs, sends = recv_f + recv_b, send_f + send_b
    if first:
        act_in[:] = x.reshape(M, rows, n_in)
    tgt = t.reshape(M, rows, width)
    wt = w.T
    head = SquaredResidual()
    losses = np.zeros(M)
    seeds: list = [None] * M

    def step():
        nonlocal gb
        MPI.Prequest.Startall(recvs)
        gw[:] = 0.0
        gb[:] = 0.0
        for i in range(M):
            if not first:
                recv_f[i].Wait()
            np.matmul(act_in[i], w, out=act_out[i])
            act_out[i] += b
            if last:
                losses[i], seeds[i] = head(act_out[i], tgt[i], inv_m)
            else:
                send_f[i].Start()
        for i in range(M):
            if last:
                dy = seeds[i]
            else:
                recv_b[i].Wait()
                dy = grad_in[i]
            accumulate_outer(gw, act_in[i], dy)
            gb += dy.sum(axis=0)
            if not first:
                np.matmul(dy, wt, out=grad_out[i])
                send_b[i].Start()
        MPI.Request.Waitall(sends)
        return gw, gb

    def free():
        for r in recvs + sends:
            r.Free()

    step.free = free  # type: ignore[attr-defined]
    return step


def dense_case(comm, width: int, mb: int, M: int, repeats: int, schedule: str = "gpipe") -> dict:
    """Step time with timing on and off and of the bare loop, interleaved, and the model."""
    from mpi4py import MPI

    spec = ModelSpec("dense", depth=comm.size, d_in=width, d_out=width, width=width, head="squared")
    batch = random_batch(spec, M * mb)
    wait = "busy" if comm.size <= 2 else "auto"
    engines = {
        c: Engine(
            comm, spec, batch, "weights", schedule, samples=1, microbatches=M, clock=c, wait=wait
        )
        for c in ("wall", "none")
    }
    point = engines["wall"].initial_point()
    ((w, b),) = engines["wall"].stage.views(engines["wall"].stage.flat)
    bare = bare_gpipe(comm, w.copy(), b.copy(), batch.x, batch.targets, M)
    # sanity: the bare loop and the engine compute the same gradient
    ref = engines["none"].evaluate(point, reduce="sum").grad
    gw, gb = bare()
    err = np.abs(np.concatenate([gw.ravel(), gb]) - ref).max() / np.abs(ref).max()
    err = comm.allreduce(float(err), op=MPI.MAX)
    if err > 1e-12:
        raise RuntimeError(f"bench dense: bare loop and engine gradients differ by {err:.2e}")
    times = paired(
        {
            "wall": lambda: engines["wall"].evaluate(point),
            "none": lambda: engines["none"].evaluate(point),
            "bare": bare,
        },
        repeats,
        warmup=2,
        comm=comm,
    )
    tf, tb = stage_compute(engines["wall"], mb)
    for e in engines.values():
        e.close()
    bare.free()
    costs = np.array(comm.allgather((tf, tb)))
    lat = channel_latency(comm, mb * width, 100)
    predicted = simulate(
        build(schedule, comm.size, M),
        costs[:, 0].tolist(),
        costs[:, 1].tolist(),
        [[lat] * M] * (comm.size - 1),
    ).makespan
    on, off, floor = (median(times[k]) for k in ("wall", "none", "bare"))
    return {
        "width": width,
        "mb": mb,
        "M": M,
        "P": comm.size,
        "measured_ms": on * 1e3,
        "untimed_ms": off * 1e3,
        "timing_cost": ratios(times["wall"], times["none"]) - 1.0,
        "bare_ms": floor * 1e3,
        "vs_bare": ratios(times["wall"], times["bare"]),
        "model_ms": predicted * 1e3,
        "efficiency": predicted / on,
        "bare_efficiency": predicted / floor,
        "t_f_us": float(costs[:, 0].mean() * 1e6),
        "t_b_us": float(costs[:, 1].mean() * 1e6),
        "msg_us": lat * 1e6,
        "grad_err": err,
    }


# the engine's cost over the bare loop that the suite holds itself to (per cell)
GOAL = {"figure": "step/bare", "at_most": 1.05}

COLUMNS = [
    ("P", "P"),
    ("width", "width"),
    ("mb", "mb"),
    ("M", "M"),
    ("measured_ms", "step (ms)"),
    ("untimed_ms", "untimed (ms)"),
    ("timing_cost", "timing cost"),
    ("bare_ms", "bare loop (ms)"),
    ("vs_bare", "step/bare"),
    ("model_ms", "model (ms)"),
    ("efficiency", "efficiency"),
    ("bare_efficiency", "bare eff."),
    ("t_f_us", "t_F (us)"),
    ("t_b_us", "t_B (us)"),
    ("msg_us", "msg (us)"),
]


def bench_dense(comm, widths, mbs, Ms, repeats: int) -> int:
    rows = [dense_case(comm, w, mb, M, repeats) for w in widths for mb in mbs for M in Ms]
    what = (
        f"GPipe training step of a dense chain (one layer per rank, float64), median of "
        f"{repeats}, timing on / off / bare loop interleaved; ratios = median of the per-round "
        "ratios; model = simulator with in-process per-stage compute times and the measured "
        "one-message channel latency"
    )
    header(comm, what)
    if comm.rank == 0:
        print(figures(COLUMNS, rows))
        print(
            "bare loop: the same step as a minimal numpy + mpi4py GPipe loop (persistent "
            "requests, the engine's gradient kernels; no schedule, clock or recording); "
            f"sanity: gradients equal (max rel. diff {max(r['grad_err'] for r in rows):.1e} "
            "<= 1e-12); efficiency = model / step"
        )
        missed = [r for r in rows if not met(GOAL, r["vs_bare"])]
        print(
            f"goal {goal_text(GOAL)}: "
            + (
                "met in every cell"
                if not missed
                else "not met at "
                + ", ".join(f"width {r['width']} mb {r['mb']} M {r['M']}" for r in missed)
            )
        )
        sane = all(r["grad_err"] <= 1e-12 for r in rows)
        head, body = columns_rows(COLUMNS, rows)
        written = write_record("dense", head, body, sane=sane, comm=comm, what=what, goal=GOAL)
        return 0 if written is not False and sane else 1
    return 0
