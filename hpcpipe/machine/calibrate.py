"""Measure a machine's cost model on the ranks of one launch (``hpcpipe calibrate``).

OSU-style loops on preallocated buffers, through the engine's own channel
(``transport.Channel``: persistent requests, a trailing clock stamp) and its
``Waiter``, so that what is measured is what a pipeline pays:

* **relay** (per wait policy and payload size): a token goes 0 → 1 → … →
  P−1 → … → 0, the critical path of a one-item pipeline without compute,
  while every rank not holding it waits under the policy. ``rounds`` round
  trips are timed as one block (osu_latency's loop, no barrier inside);
  hop time = block / (rounds · 2(P − 1)); the figure is the median over
  blocks. The hop times over sizes are fitted by α + β·bytes (``fit``):
  α is then the cost of a message to a waiting rank, wake-up included.
* **wake-up**: rank 1 waits under the policy while rank 0 stays idle
  ``idle`` seconds, then sends a clock stamp; the one-way latency, on
  clocks aligned by ``clocks.align_wall_clocks``, is what a rank that has
  waited (and, oversubscribed, been descheduled) takes to receive.
* **layers**: rank 0 alone (the others wait under the sleep policy) times
  the forward and backward of one item (``rows`` × width) through one block
  of each built-in kind; blocks of repeats sized to ``block`` seconds,
  median over blocks.
* **noise**: with the layers, rank 0 times the draw of one item's Gaussian
  smoothing noise (``rng.noise``, rows × width), what the first stage of a
  run that smooths its input pays per sample.
* **emulated**: rank 0 times ``time.sleep(layer_time)``, what an emulated
  action costs.
* **action overhead** (per wait policy): the engine itself runs one GPipe
  oracle call of K = ``overhead_items`` items through an orthogonal chain of
  one layer per rank at the first width (emulated ``layer_time`` if set),
  median over repeats. What the measured layer, emulated-action and message
  costs above do not explain, per slot of the critical path,
  o = (measured − model)/(2(K + P − 1)) (clipped at 0), is the engine's
  per-action cost at this rank count: Python bookkeeping, starting and
  completing requests, a waiting rank's wake-up beyond the relay's. The
  profile charges it on every action (``profile.cost_model``). K is kept
  small so that a run with other K, schedules or depths is a prediction, not
  the fit.

Timing budget: every (policy, size) gets at least ``MIN_BLOCKS`` blocks and
at most ``budget`` seconds (rank 0 decides and broadcasts, so all ranks run
the same loop).
"""

from __future__ import annotations

import math
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass

import numpy as np

from hpcpipe.machine.cores import cores

SIZES = (8, 2048, 16384, 131072)  # payload bytes of the relay (the stamp adds 8)
MIN_BLOCKS = 3


@dataclass(frozen=True)
class Fit:
    """hop(bytes) = alpha + beta·bytes, and the relative RMS residual of the fit."""

    alpha: float
    beta: float
    residual: float


def fit(sizes, seconds) -> Fit:
    """Least-squares α + β·bytes through (sizes, seconds), with α, β >= 0.

    Unconstrained least squares first; when it gives β < 0 (noise on a flat
    curve) the fit is the constant α = mean, β = 0; when α < 0, the line
    through the origin β = Σ b·y / Σ b². residual = RMS(fit − y) / mean(y).
    """
    b = np.asarray(sizes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if b.shape != y.shape or b.size == 0:
        raise ValueError(f"fit needs one time per size, got {b.size} sizes and {y.size} times")
    if b.size >= 2 and np.ptp(b) > 0:
        beta, alpha = np.polyfit(b, y, 1)
    else:
        beta, alpha = 0.0, float(y.mean())
    if beta < 0:
        alpha, beta = float(y.mean()), 0.0
    if alpha < 0:
        alpha, beta = 0.0, float((b @ y) / (b @ b))
    res = float(np.sqrt(np.mean((alpha + beta * b - y) ** 2)) / y.mean()) if y.mean() > 0 else 0.0
    return Fit(float(alpha), float(beta), res)


def spread(xs) -> float:
    """Relative interquartile range (q75 − q25) / median of repeated timings."""
    q25, q50, q75 = np.percentile(np.asarray(xs, dtype=float), [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else 0.0


# ---------------------------------------------------------------- helpers on all ranks
def _agree(comm, value: int) -> int:
    """Rank 0's integer on every rank (a buffer Bcast)."""
    from mpi4py import MPI

    buf = np.array([value], dtype=np.int64)
    comm.Bcast([buf, MPI.INT64_T], root=0)
    return int(buf[0])


def _idle_until_done(comm, waiter, busy_ranks: set[int], work) -> None:
    """Ranks in ``busy_ranks`` run ``work()``; the others wait under ``waiter`` in an
    Ibarrier, which all enter at the end."""
    if comm.rank in busy_ranks:
        work()
    req = comm.Ibarrier()
    waiter.wait(req)


# ---------------------------------------------------------------- relay
def relay(comm, nbytes: int, waiter, budget: float) -> float:
    """Median seconds per hop of a token relayed 0 → P−1 → 0 (see the module docstring)."""
    from mpi4py import MPI

    from hpcpipe.pipeline.transport import BWD, FWD, Channel

    P, r = comm.size, comm.rank
    n = max(nbytes // 8, 1)
    rf = Channel(comm, r - 1, FWD, False, [1], n) if r > 0 else None
    sb = Channel(comm, r - 1, BWD, True, [1], n) if r > 0 else None
    sf = Channel(comm, r + 1, FWD, True, [1], n) if r < P - 1 else None
    rb = Channel(comm, r + 1, BWD, False, [1], n) if r < P - 1 else None
    wait = waiter.wait

    def one_round() -> None:
        if rf is not None:
            rf.requests[0].Start()
        if rb is not None:
            rb.requests[0].Start()
        if rf is not None:
            wait(rf.requests[0])
        if sf is not None:
            sf.slots[0][-1] = 0.0
            sf.requests[0].Start()
            wait(rb.requests[0])
        if sb is not None:
            sb.requests[0].Start()
            wait(sb.requests[0])
        if sf is not None:
            wait(sf.requests[0])

    def block(rounds: int) -> float:
        comm.Barrier()
        t0 = MPI.Wtime()
        for _ in range(rounds):
            one_round()
        return (MPI.Wtime() - t0) / (rounds * 2 * (P - 1))

    try:
        probe = block(1)  # warm-up, and the size of a block
        rounds = _agree(
            comm, max(1, int(budget / (4 * MIN_BLOCKS) / max(probe * 2 * (P - 1), 1e-9)))
        )
        hops, start = [], time.perf_counter()
        while True:
            hops.append(block(rounds))
            more = len(hops) < MIN_BLOCKS or (
                time.perf_counter() - start < budget / 2 and len(hops) < 4 * MIN_BLOCKS
            )
            if not _agree(comm, int(more)):
                break
        return float(_agree_float(comm, statistics.median(hops)))
    finally:
        for ch in (rf, sb, sf, rb):
            if ch is not None:
                ch.free()


def _agree_float(comm, value: float) -> float:
    from mpi4py import MPI

    buf = np.array([value])
    comm.Bcast([buf, MPI.DOUBLE], root=0)
    return float(buf[0])


# ---------------------------------------------------------------- wake-up
def wakeup(comm, waiter, idle: float, repeats: int) -> float:
    """Median one-way latency (s) from rank 0 to rank 1 after rank 1 waited ``idle`` s."""
    from mpi4py import MPI

    from hpcpipe.pipeline.clocks import align_wall_clocks

    origin = align_wall_clocks(comm)
    buf = np.zeros(1)
    lat = np.zeros(repeats)

    def work() -> None:
        for i in range(repeats):
            if comm.rank == 0:
                time.sleep(idle)
                buf[0] = time.perf_counter() - origin
                comm.Send([buf, MPI.DOUBLE], dest=1, tag=11)
            else:
                req = comm.Irecv([buf, MPI.DOUBLE], source=0, tag=11)
                waiter.wait(req)
                lat[i] = (time.perf_counter() - origin) - buf[0]
        if comm.rank == 1:
            comm.Send([lat, MPI.DOUBLE], dest=0, tag=12)
        else:
            comm.Recv([lat, MPI.DOUBLE], source=1, tag=12)

    _idle_until_done(comm, waiter, {0, 1}, work)
    return _agree_float(comm, float(np.median(lat)) if comm.rank == 0 else 0.0)


# ---------------------------------------------------------------- layers
def _repeat(fn, block: float, blocks: int) -> list[float]:
    """Seconds per call of ``fn``: calls per block sized to ~``block`` s, ``blocks`` blocks."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(block / one))
    out = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps)
    return out


def layer_times(kind: str, width: int, rows: int, block: float, blocks: int) -> dict:
    """Forward and backward seconds of one item (rows × width) through one block of ``kind``.

    The block is built as a model's would be (``ModelSpec.block(0)`` of a depth-2
    model: an MLP block is Dense + ReLU); parameter gradients are accumulated for the
    kinds that have parameters, as a training run does.
    """
    from hpcpipe.model import rng
    from hpcpipe.model.layers import backward_layers_into, forward_layers_into
    from hpcpipe.model.stages import ModelSpec

    spec = ModelSpec(kind, depth=2, d_in=width, d_out=width, width=width)
    layers = spec.block(0)
    params = [layer.params() for layer in layers]
    grads = None if kind == "orthogonal" else [[np.zeros_like(p) for p in ps] for ps in params]
    g = np.random.default_rng(0)
    x = g.standard_normal((rows, width))
    dy = g.standard_normal((rows, width))
    out, dx = np.zeros((rows, width)), np.zeros((rows, width))
    caches = forward_layers_into(layers, x, params, out)
    fwd = _repeat(lambda: forward_layers_into(layers, x, params, out), block, blocks)
    bwd = _repeat(
        lambda: backward_layers_into(layers, dy, caches, params, grads, dx), block, blocks
    )
    # the smoothing noise Z_k of one item, drawn as the engine draws it (a counter-based
    # generator per (call, sample), rows × width normals, x + γZ_k)
    draws = iter(range(1 << 62))
    noise = _repeat(
        lambda: x + 0.5 * rng.noise(0, 0, rng.INPUT_PARAM_ID, next(draws), x.shape), block, blocks
    )
    return {
        "kind": kind,
        "width": width,
        "rows": rows,
        "forward": float(np.median(fwd)),
        "backward": float(np.median(bwd)),
        "spread": max(spread(fwd), spread(bwd)),
        "noise": float(np.median(noise)),
    }


def sleep_time(layer_time: float, repeats: int) -> dict:
    """The measured duration of ``time.sleep(layer_time)``: an emulated action."""
    xs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        time.sleep(layer_time)
        xs.append(time.perf_counter() - t0)
    return {"layer_time": layer_time, "sleep": float(np.median(xs)), "spread": spread(xs)}


# ---------------------------------------------------------------- action overhead
def engine_call(comm, policy: str, layer_time: float, width: int, K: int, repeats: int) -> float:
    """Median wall seconds of one GPipe oracle call (one orthogonal layer per rank, K items)."""
    from hpcpipe.model.stages import ModelSpec, random_batch
    from hpcpipe.pipeline.engine import Engine

    spec = ModelSpec("orthogonal", depth=comm.size, d_in=width, d_out=width, head="squared")
    eng = Engine(
        comm,
        spec,
        random_batch(spec, 1),
        "input",
        "gpipe",
        samples=K,
        microbatches=1,
        clock="wall",
        layer_time=layer_time,
        wait=policy,
    )
    point = eng.initial_point()
    times = []
    try:
        for _ in range(repeats + 1):  # the first call warms up
            comm.Barrier()
            times.append(eng.evaluate(point, gamma=0.0).time)
    finally:
        eng.close()
    return _agree_float(comm, float(np.median(times[1:])))


def action_overhead(data: dict, policy: str, measured: float, width: int, K: int) -> float:
    """o = (measured − model without it)/(2(K + P − 1)), ≥ 0: seconds per action (docs above)."""
    from hpcpipe.machine.profile import dumps, parse
    from hpcpipe.model.stages import ModelSpec
    from hpcpipe.pipeline.schedules import build
    from hpcpipe.pipeline.simulator import message_costs, simulate, stage_times

    P = int(data["placement"]["ranks"])
    prof = parse(dumps(data))
    spec = ModelSpec("orthogonal", depth=P, d_in=width, d_out=width)
    lt = float(data.get("emulated", {}).get("layer_time", 0.0))
    costs = prof.cost_model(spec, 1, policy, lt)
    tf, tb = stage_times(costs, P, P)
    msg = message_costs(costs, [width] * (P - 1), [1] * K)
    model = simulate(build("gpipe", P, K), tf, tb, msg).makespan
    return max(0.0, (measured - model) / (2 * (K + P - 1)))


# ---------------------------------------------------------------- the whole calibration
@dataclass
class Plan:
    """What to measure (the ``hpcpipe calibrate`` options)."""

    policies: tuple[str, ...] = ("busy", "yield", "sleep")
    sizes: tuple[int, ...] = SIZES
    kinds: tuple[str, ...] = ("orthogonal", "dense", "mlp")
    widths: tuple[int, ...] = (16, 32, 64, 128, 256)
    rows: int = 1
    layer_time: float = 0.0
    budget: float = 1.0  # seconds per (policy, size) relay
    idle: float = 0.005  # seconds a rank waits before the wake-up message
    wake_repeats: int = 20
    overhead_items: int = 4
    overhead_repeats: int = 5
    command: str = ""


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (the hook tests replace to fake a busy machine)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []


def busy_note(
    load_start: list[float], load_end: list[float], n_cores: int, foreign: float = math.nan
) -> str:
    """'' on a quiet machine; else one line saying the costs were measured under load.

    Busy: other processes used more than ``foreign.BUSY_SHARE`` of the cores during the
    calibration (``foreign``, cores: ``machine.foreign``); where that was not measured,
    the 1-minute load average above the cores at the start or the end (which counts the
    calibration's own ranks and the minute before it). Other processes then share the
    cores, so the measured α, wake-up and layer times include their time slices:
    predictions from the profile are those of a busy machine. Calibration is not
    refused (the profile says so, in ``machine.busy``).
    """
    from hpcpipe.machine.foreign import BUSY_SHARE, busy

    if math.isfinite(foreign):
        if not busy(foreign, n_cores):
            return ""
        return (
            f"calibrated while other processes used {foreign:.2f} of {n_cores} cores (above "
            f"{BUSY_SHARE:g} of them: busy machine): its costs include their time; "
            "calibrate again on a quiet machine"
        )
    loads = [x[0] for x in (load_start, load_end) if x]
    if not loads or max(loads) <= n_cores:
        return ""
    return (
        f"calibrated under load {max(loads):.2f} on {n_cores} cores (busy machine): its "
        "costs include other processes' time; calibrate again on a quiet machine"
    )


def identity(
    load_start: list[float], library: str, command: str, seconds: float, foreign: float = math.nan
) -> dict:
    """The [machine] table: host, cores, MPI library, date, load at start and end, the
    other processes' CPU during the calibration (``foreign_cpu``, cores), busy."""
    from hpcpipe import __version__

    n_cores = cores()
    load_end = load_average()
    note = busy_note(load_start, load_end, n_cores, foreign)
    return {
        "host": socket.gethostname(),
        "architecture": platform.machine(),
        "cores": n_cores,
        "mpi_library": library,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_start": load_start,
        "load_end": load_end,
        **({"foreign_cpu": round(foreign, 3)} if math.isfinite(foreign) else {}),
        "busy": bool(note),
        **({"busy_note": note} if note else {}),
        "hpcpipe": __version__,
        "command": command,
        "seconds": round(seconds, 3),
    }


def calibrate(comm, plan: Plan) -> dict | None:
    """Run every measurement of ``plan`` on ``comm``; the profile's data on rank 0, else None.

    Needs at least 2 ranks (a message needs a receiver).
    """

    from hpcpipe.mpi_library import library_name
    from hpcpipe.pipeline.transport import Waiter

    if comm.size < 2:
        raise ValueError("calibration needs at least 2 ranks: a message needs a receiver")
    from hpcpipe.machine.foreign import ForeignLoad

    t_start = time.perf_counter()
    load_start = load_average()
    span = ForeignLoad(comm)  # the other processes' CPU while calibrating
    hosts = comm.allgather(socket.gethostname())
    messages = {}
    for pol in plan.policies:
        waiter = Waiter(pol, comm.size)
        hops = [relay(comm, b, waiter, plan.budget) for b in plan.sizes]
        f = fit(plan.sizes, hops)
        wake = wakeup(comm, waiter, plan.idle, plan.wake_repeats)
        messages[pol] = {
            "alpha": f.alpha,
            "beta": f.beta,
            "residual": f.residual,
            "sizes": list(plan.sizes),
            "hop_seconds": hops,
            "wakeup": wake,
        }
    sleeper = Waiter("sleep", comm.size)
    layers: list[dict] = []
    emulated: dict = {}

    def measure_compute() -> None:
        for kind in plan.kinds:
            for w in plan.widths:
                layers.append(layer_times(kind, w, plan.rows, 0.01, 5))
        if plan.layer_time > 0:
            emulated.update(sleep_time(plan.layer_time, 15))

    _idle_until_done(comm, sleeper, {0}, measure_compute)
    comm.Barrier()
    width = plan.widths[0]
    calls = {}
    if "orthogonal" in plan.kinds:
        for pol in plan.policies:
            calls[pol] = engine_call(
                comm, pol, plan.layer_time, width, plan.overhead_items, plan.overhead_repeats
            )
    foreign = span.stop()
    if comm.rank != 0:
        return None
    machine = identity(
        load_start,
        library_name(),
        plan.command,
        time.perf_counter() - t_start,
        foreign,
    )
    counts = {h: hosts.count(h) for h in hosts}
    data = {
        "machine": machine,
        "placement": {
            "ranks": comm.size,
            "hosts": sorted(counts),
            "ranks_per_host": max(counts.values()),
        },
        "message": messages,
        "layers": layers,
        "emulated": emulated,
    }
    for pol, measured in calls.items():
        o = action_overhead(data, pol, measured, width, plan.overhead_items)
        messages[pol]["action_overhead"] = o
    return data
