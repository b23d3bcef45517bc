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

from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import Engine
from hpcpipe.pipeline.schedules import build
from hpcpipe.pipeline.simulator import simulate, stage_times
from hpcpipe.run.table import table


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


# ---------------------------------------------------------------- transport

SIZES = [8 << k for k in range(0, 20)]  # 8 B .. 4 MiB


def _pingpong_raw(comm, buf, iters: int) -> float:
    """Median one-way latency (s) of blocking Send/Recv ping-pong, buffer API."""
    from mpi4py import MPI

    peer = 1 - comm.rank
    spec = [buf, MPI.DOUBLE]
    out = []
    for _ in range(iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        if comm.rank == 0:
            comm.Send(spec, peer, 1)
            comm.Recv(spec, peer, 1)
        else:
            comm.Recv(spec, peer, 1)
            comm.Send(spec, peer, 1)
        out.append((MPI.Wtime() - t0) / 2)
    return statistics.median(out)


def _pingpong_channel(comm, n_doubles: int, iters: int, waiter) -> float:
    """The same ping-pong over hpcpipe Channels: the engine's exact send/receive path.

    Persistent requests on a preallocated slot (payload + the clock stamp),
    receive started before the send, completed by the engine's Waiter.
    """
    from mpi4py import MPI

    from hpcpipe.pipeline.transport import BWD, FWD, Channel

    peer = 1 - comm.rank
    send = Channel(comm, peer, FWD if comm.rank == 0 else BWD, True, [1], n_doubles)
    recv = Channel(comm, peer, BWD if comm.rank == 0 else FWD, False, [1], n_doubles)
    sreq, rreq = send.requests[0], recv.requests[0]
    out = []
    for _ in range(iters):
        comm.Barrier()
        t0 = MPI.Wtime()
        rreq.Start()
        if comm.rank == 0:
            send.slots[0][-1] = t0
            sreq.Start()
            waiter.wait(rreq)
            waiter.wait(sreq)
        else:
            waiter.wait(rreq)
            send.slots[0][-1] = t0
            sreq.Start()
            waiter.wait(sreq)
        out.append((MPI.Wtime() - t0) / 2)
    send.free()
    recv.free()
    return statistics.median(out)


def _bandwidth_raw(comm, buf, window: int, reps: int) -> float:
    """OSU osu_bw style: a window of Isend/Irecv, then a 1-double ack; bytes/s."""
    from mpi4py import MPI

    peer = 1 - comm.rank
    ack = np.zeros(1)
    out = []
    for _ in range(reps):
        comm.Barrier()
        t0 = MPI.Wtime()
        if comm.rank == 0:
            reqs = [comm.Isend([buf, MPI.DOUBLE], peer, 2) for _ in range(window)]
            MPI.Request.Waitall(reqs)
            comm.Recv([ack, MPI.DOUBLE], peer, 3)
        else:
            reqs = [comm.Irecv([buf, MPI.DOUBLE], peer, 2) for _ in range(window)]
            MPI.Request.Waitall(reqs)
            comm.Send([ack, MPI.DOUBLE], peer, 3)
        out.append(MPI.Wtime() - t0)
    return window * buf.nbytes / statistics.median(out)


def _bandwidth_channel(comm, n_doubles: int, window: int, reps: int, waiter) -> float:
    """The same window over Channels: one persistent request per item, as in a GPipe call."""
    from mpi4py import MPI

    from hpcpipe.pipeline.transport import FWD, Channel

    peer = 1 - comm.rank
    ch = Channel(comm, peer, FWD, comm.rank == 0, [1] * window, n_doubles)
    ack = np.zeros(1)
    out = []
    for _ in range(reps):
        comm.Barrier()
        t0 = MPI.Wtime()
        MPI.Prequest.Startall(ch.requests)
        waiter.waitall(ch.requests)
        if comm.rank == 0:
            comm.Recv([ack, MPI.DOUBLE], peer, 3)
        else:
            comm.Send([ack, MPI.DOUBLE], peer, 3)
        out.append(MPI.Wtime() - t0)
    ch.free()
    return window * n_doubles * 8 / statistics.median(out)


def bench_transport(comm, max_bytes: int, iters: int, wait: str) -> int:
    from hpcpipe.pipeline.transport import Waiter

    if comm.size != 2:
        if comm.rank == 0:
            print("bench transport needs exactly 2 ranks (--np 2)")
        return 2
    waiter = Waiter(wait, comm.size)
    rows = []
    for size in [s for s in SIZES if s <= max_bytes]:
        n = size // 8
        buf = np.zeros(n)
        it = iters if size <= 65536 else max(10, iters // 10)
        # interleave raw and channel measurements so both see the same machine state
        lat_raw = min(_pingpong_raw(comm, buf, it), _pingpong_raw(comm, buf, it))
        lat_ch = min(_pingpong_channel(comm, n, it, waiter), _pingpong_channel(comm, n, it, waiter))
        window = 64 if size <= 1 << 20 else 16
        reps = 10 if size <= 1 << 16 else 5
        bw_raw = _bandwidth_raw(comm, buf, window, reps)
        bw_ch = _bandwidth_channel(comm, n, window, reps, waiter)
        rows.append(
            [
                size,
                lat_raw * 1e6,
                lat_ch * 1e6,
                lat_ch / lat_raw,
                bw_raw / 1e6,
                bw_ch / 1e6,
                bw_ch / bw_raw,
            ]
        )
    if comm.rank == 0:
        print("command: hpcpipe " + " ".join(sys.argv[1:]))
        print(machine_line(comm))
        print(
            f"ping-pong latency (median of {iters}, best of 2 interleaved runs) and "
            f"windowed bandwidth; wait policy {waiter.policy}"
        )
        print(
            table(
                [
                    "bytes",
                    "raw lat (us)",
                    "channel lat (us)",
                    "lat ratio",
                    "raw bw (MB/s)",
                    "channel bw (MB/s)",
                    "bw ratio",
                ],
                rows,
            )
        )
        ok = all(np.isfinite(r).all() and r[1] > 0 for r in np.array(rows))
        print("sanity: " + ("ok" if ok else "FAILED (non-finite or zero times)"))
        return 0 if ok else 1
    return 0


# ---------------------------------------------------------------- simulator


def bench_simulate(repeats: int = 3, stages: int = 1024, items: int = 1024) -> int:
    """Simulator throughput in actions per second (one core, no MPI)."""
    from hpcpipe.pipeline.simulator import throughput

    print("command: hpcpipe " + " ".join(sys.argv[1:]))
    print(
        f"machine {socket.gethostname()} ({platform.machine()}), python "
        f"{platform.python_version()}, one process"
    )
    rows = []
    for name in ("sequential", "gpipe", "1f1b"):
        runs = [throughput(stages, items, name) for _ in range(repeats)]
        n = runs[0][0]
        t = statistics.median(r[1] for r in runs)
        rows.append([name, stages, items, n, t, n / t / 1e6])
    print(table(["schedule", "S", "n", "actions", "median (s)", "M actions/s"], rows))
    return 0


# ---------------------------------------------------------------- real dense layers


def _time_stage_compute(eng: Engine, rows: int, repeats: int = 50) -> tuple[float, float]:
    """Median (t_F, t_B) of this rank's stage on one microbatch, measured in-process."""
    import time

    from hpcpipe.model.layers import backward_layers, forward_layers

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
    return statistics.median(tf), statistics.median(tb)


def _bare_gpipe(comm, w: np.ndarray, b: np.ndarray, x: np.ndarray, t: np.ndarray, M: int):
    """The floor to compare against: a bare numpy + mpi4py GPipe step, one dense layer per rank.

    The same computation as the engine's training step (y = xW + b, squared
    residual head ½‖y − t‖²/m on the last rank, dW and db summed over the M
    microbatches), written as the shortest loop: preallocated buffers, every
    receive posted first (``Irecv``), ``Isend`` after each action, ``Waitall``
    at the end; no schedule, clock or recording. Returns a function running
    one step and returning (dW, db).
    """
    from mpi4py import MPI

    rank, size = comm.rank, comm.size
    rows = x.shape[0] // M
    width = w.shape[1]
    first, last = rank == 0, rank == size - 1
    act_in = np.zeros((M, rows, w.shape[0]))  # activations received (or x on rank 0)
    grad_in = np.zeros((M, rows, width))  # gradients received from the next rank
    act_out = np.zeros((M, rows, width))
    grad_out = np.zeros((M, rows, w.shape[0]))
    gw, gb = np.zeros_like(w), np.zeros_like(b)
    inv_m = 1.0 / x.shape[0]
    D = MPI.DOUBLE

    def step():
        reqs = []
        if not first:
            reqs += [comm.Irecv([act_in[i], D], rank - 1, 2 * i) for i in range(M)]
        if not last:
            reqs += [comm.Irecv([grad_in[i], D], rank + 1, 2 * i + 1) for i in range(M)]
        recv_f = reqs[:M] if not first else []
        recv_b = reqs[-M:] if not last else []
        sends = []
        gw[:] = 0.0
        gb[:] = 0.0
        for i in range(M):
            if first:
                act_in[i] = x[i * rows : (i + 1) * rows]
            else:
                recv_f[i].Wait()
            np.matmul(act_in[i], w, out=act_out[i])
            act_out[i] += b
            if last:
                grad_in[i] = (act_out[i] - t[i * rows : (i + 1) * rows]) * inv_m
            else:
                sends.append(comm.Isend([act_out[i], D], rank + 1, 2 * i))
        for i in range(M):
            if not last:
                recv_b[i].Wait()
            gw[...] += act_in[i].T @ grad_in[i]
            gb[...] += grad_in[i].sum(axis=0)
            if not first:
                np.matmul(grad_in[i], w.T, out=grad_out[i])
                sends.append(comm.Isend([grad_out[i], D], rank - 1, 2 * i + 1))
        MPI.Request.Waitall(sends)
        return gw, gb

    return step


def dense_case(comm, width: int, mb: int, M: int, repeats: int, schedule: str = "gpipe"):
    """One training step (weights variable) of a dense chain, one layer per rank.

    Returns measured step time with timing on (wall clock) and off (no clock
    reads), interleaved, and the model's prediction from in-process
    per-stage compute times and the measured channel latency of one message.
    """
    import time

    from mpi4py import MPI

    spec = ModelSpec("dense", depth=comm.size, d_in=width, d_out=width, width=width, head="squared")
    batch = random_batch(spec, M * mb)
    engines = {
        c: Engine(
            comm,
            spec,
            batch,
            "weights",
            schedule,
            samples=1,
            microbatches=M,
            clock=c,
            wait="busy" if comm.size <= 2 else "auto",
        )
        for c in ("wall", "none")
    }
    point = engines["wall"].initial_point()
    ((w, b),) = engines["wall"].stage.views(engines["wall"].stage.flat)
    bare = _bare_gpipe(comm, w.copy(), b.copy(), batch.x, batch.targets, M)
    # sanity: the bare loop and the engine compute the same gradient
    ref = engines["none"].evaluate(point, reduce="sum").grad
    gw, gb = bare()
    err = np.abs(np.concatenate([gw.ravel(), gb]) - ref).max() / np.abs(ref).max()
    err = comm.allreduce(float(err), op=MPI.MAX)
    if err > 1e-12:
        raise RuntimeError(f"bench dense: bare loop and engine gradients differ by {err:.2e}")
    runs = {
        "wall": lambda: engines["wall"].evaluate(point),
        "none": lambda: engines["none"].evaluate(point),
        "bare": bare,
    }
    times = {c: [] for c in runs}
    order = list(runs)
    for r in range(repeats + 2):
        for c in order if r % 2 == 0 else order[::-1]:
            comm.Barrier()
            t0 = time.perf_counter()
            runs[c]()
            dt = np.array([time.perf_counter() - t0])
            comm.Allreduce(MPI.IN_PLACE, [dt, MPI.DOUBLE], op=MPI.MAX)
            if r >= 2:
                times[c].append(float(dt[0]))
    tf, tb = _time_stage_compute(engines["wall"], mb)
    for e in engines.values():
        e.close()
    costs = np.array(comm.allgather((tf, tb)))
    lat = _pingpong_channel_pair(comm, mb * width, 100)
    predicted = simulate(
        build(schedule, comm.size, M),
        costs[:, 0].tolist(),
        costs[:, 1].tolist(),
        [[lat] * M] * (comm.size - 1),
    ).makespan
    on, off = statistics.median(times["wall"]), statistics.median(times["none"])
    floor = statistics.median(times["bare"])
    return {
        "width": width,
        "mb": mb,
        "M": M,
        "P": comm.size,
        "measured_ms": on * 1e3,
        "untimed_ms": off * 1e3,
        "timing_cost": on / off - 1.0,
        "bare_ms": floor * 1e3,
        "vs_bare": on / floor,
        "model_ms": predicted * 1e3,
        "efficiency": predicted / on,
        "bare_efficiency": predicted / floor,
        "t_f_us": float(costs[:, 0].mean() * 1e6),
        "t_b_us": float(costs[:, 1].mean() * 1e6),
        "msg_us": lat * 1e6,
    }


def _pingpong_channel_pair(comm, n_doubles: int, iters: int) -> float:
    """Median one-way latency between ranks 0 and 1 over Channels (others idle)."""
    from hpcpipe.pipeline.transport import Waiter

    sub = comm.Split(0 if comm.rank < 2 else 1, comm.rank)
    lat = 0.0
    if comm.rank < 2 and sub.size == 2:
        lat = _pingpong_channel(sub, n_doubles, iters, Waiter("auto", comm.size))
    sub.Free()
    return float(comm.bcast(lat, root=0))


def bench_dense(comm, widths, mbs, Ms, repeats: int) -> int:
    rows = []
    for w in widths:
        for mb in mbs:
            for M in Ms:
                rows.append(dense_case(comm, w, mb, M, repeats))
    if comm.rank == 0:
        print("command: hpcpipe " + " ".join(sys.argv[1:]))
        print(machine_line(comm))
        print(
            f"GPipe training step of a dense chain (one layer per rank, float64), median of "
            f"{repeats}, timing on / off / bare loop interleaved; model = simulator with "
            "in-process per-stage compute times and the measured one-message channel latency"
        )
        cols = [
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
        print(table([h for _, h in cols], [[r[k] for k, _ in cols] for r in rows]))
        print(
            "bare loop: the same step as a minimal numpy + mpi4py GPipe loop (no schedule, "
            "clock or recording; same gradient, checked <= 1e-12); efficiency = model / step"
        )
    return 0
