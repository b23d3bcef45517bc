"""``hpcpipe bench transport``: hpcpipe's channel against the best raw mpi4py path.

Latency (osu_latency's loop): after ``warmup`` untimed round trips, ``iters``
back-to-back round trips are timed as one block, no barrier inside;
one-way latency = block time / (2 · iters). Bandwidth (osu_bw's loop): a
window of W messages is sent, the receiver answers with a 1-double ack;
after warm-up windows, the timed block is ``reps`` windows back to back;
bandwidth = W · reps · bytes / block time.

The raw side is the fastest of three mpi4py buffer-API paths, each measured
in the same run: blocking ``Send``/``Recv``; a receive posted before the
send (``Irecv`` ... ``Send``, ``Wait``; for bandwidth ``Isend``/``Irecv`` of
one buffer, osu_bw's own loop); persistent requests (``Send_init``/
``Recv_init``, ``Start``; for bandwidth one buffer per message of the
window, as the channel has). The channel side is exactly what
the engine does: per-item slots of one preallocated buffer with a trailing
clock stamp, persistent requests, the receive started before the send, the
wait through the engine's ``Waiter``. Raw and channel blocks alternate
(raw, channel, channel, raw, ...); each figure is the median over rounds
and each ratio the median of the per-round ratios.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hpcpipe.bench.common import finish, header, median

SIZES = [8 << k for k in range(0, 20)]  # 8 B .. 4 MiB
RAW_PATHS = ("send-recv", "irecv", "persistent")


def _latency_loop(comm, kind: str, n_doubles: int, waiter) -> Callable[[int], float]:
    """A function running ``iters`` timed round trips; returns one-way latency (s)."""
    from mpi4py import MPI

    from hpcpipe.pipeline.transport import BWD, FWD, Channel

    peer, rank = 1 - comm.rank, comm.rank
    D = MPI.DOUBLE
    sbuf, rbuf = np.zeros(n_doubles), np.zeros(n_doubles)
    wtime = MPI.Wtime
    if kind == "send-recv":
        s, r = [sbuf, D], [rbuf, D]

        def trips(iters: int) -> float:
            t0 = wtime()
            if rank == 0:
                for _ in range(iters):
                    comm.Send(s, peer, 1)
                    comm.Recv(r, peer, 1)
            else:
                for _ in range(iters):
                    comm.Recv(r, peer, 1)
                    comm.Send(s, peer, 1)
            return (wtime() - t0) / (2 * iters)

        return trips
    if kind == "irecv":
        s, r = [sbuf, D], [rbuf, D]

        def trips(iters: int) -> float:
            t0 = wtime()
            for _ in range(iters):
                req = comm.Irecv(r, peer, 1)
                if rank == 0:
                    comm.Send(s, peer, 1)
                    req.Wait()
                else:
                    req.Wait()
                    comm.Send(s, peer, 1)
            return (wtime() - t0) / (2 * iters)

        return trips
    if kind == "persistent":
        sreq = comm.Send_init([sbuf, D], peer, 1)
        rreq = comm.Recv_init([rbuf, D], peer, 1)

        def trips(iters: int) -> float:
            t0 = wtime()
            for _ in range(iters):
                rreq.Start()
                if rank == 0:
                    sreq.Start()
                    rreq.Wait()
                else:
                    rreq.Wait()
                    sreq.Start()
                sreq.Wait()
            return (wtime() - t0) / (2 * iters)

        trips.free = lambda: (sreq.Free(), rreq.Free())  # type: ignore[attr-defined]
        return trips
    # the engine's path: channel slots (payload + clock stamp), persistent requests
    send = Channel(comm, peer, FWD if rank == 0 else BWD, True, [1], n_doubles)
    recv = Channel(comm, peer, BWD if rank == 0 else FWD, False, [1], n_doubles)
    sreq, rreq = send.requests[0], recv.requests[0]
    slot = send.slots[0]
    # as the engine: a busy wait without watchdog calls MPI directly
    wait = MPI.Request.Wait if waiter.policy == "busy" and waiter.timeout <= 0 else waiter.wait

    def trips(iters: int) -> float:
        t0 = wtime()
        for _ in range(iters):
            rreq.Start()
            if rank == 0:
                slot[-1] = t0
                sreq.Start()
                wait(rreq)
            else:
                wait(rreq)
                slot[-1] = t0
                sreq.Start()
            wait(sreq)
        return (wtime() - t0) / (2 * iters)

    trips.free = lambda: (send.free(), recv.free())  # type: ignore[attr-defined]
    return trips


def _bandwidth_loop(comm, kind: str, n_doubles: int, window: int, waiter):
    """A function running ``reps`` timed windows; returns bytes/s."""
    from mpi4py import MPI

    from hpcpipe.pipeline.transport import FWD, Channel

    peer, rank = 1 - comm.rank, comm.rank
    D = MPI.DOUBLE
    buf = np.zeros(n_doubles)
    ack = np.zeros(1)
    wtime = MPI.Wtime
    sender = rank == 0
    if kind == "channel":
        ch = Channel(comm, peer, FWD, sender, [1] * window, n_doubles)
        reqs = ch.requests
        start = MPI.Prequest.Startall
        waitall = waiter.waitall
    elif kind == "persistent":  # one buffer per message of the window, as the channel has
        init = comm.Send_init if sender else comm.Recv_init
        bufs = np.zeros((window, n_doubles))
        reqs = [init([bufs[i], D], peer, 2) for i in range(window)]
        start = MPI.Prequest.Startall
        waitall = MPI.Request.Waitall
    else:
        reqs = None

    def post():
        if reqs is not None:
            start(reqs)
            return reqs
        if kind == "send-recv" and sender:
            for _ in range(window):
                comm.Send([buf, D], peer, 2)
            return []
        if kind == "send-recv":
            for _ in range(window):
                comm.Recv([buf, D], peer, 2)
            return []
        op = comm.Isend if sender else comm.Irecv
        return [op([buf, D], peer, 2) for _ in range(window)]

    def windows(reps: int) -> float:
        t0 = wtime()
        for _ in range(reps):
            rs = post()
            if reqs is not None:
                waitall(rs)
            elif rs:
                MPI.Request.Waitall(rs)
            if sender:
                comm.Recv([ack, D], peer, 3)
            else:
                comm.Send([ack, D], peer, 3)
        return window * reps * n_doubles * 8 / (wtime() - t0)

    def free():
        if kind == "channel":
            ch.free()
        elif reqs is not None:
            for r in reqs:
                r.Free()

    windows.free = free  # type: ignore[attr-defined]
    return windows


def _rounds(comm, raw: dict, chan, block: int, rounds: int) -> tuple[dict, list[float]]:
    """Alternate raw paths and the channel over ``rounds``; per-round figures."""
    out: dict[str, list[float]] = {k: [] for k in raw}
    ch: list[float] = []
    for r in range(rounds + 1):  # round 0 warms up every path
        sides = [*raw, "channel"]
        for k in sides if r % 2 == 0 else sides[::-1]:
            comm.Barrier()
            f = chan if k == "channel" else raw[k]
            v = f(block)
            if r > 0:
                (ch if k == "channel" else out[k]).append(v)
    return out, ch


def transport_row(comm, size: int, iters: int, rounds: int, waiter) -> dict:
    """One message size: latency and bandwidth of every raw path and of the channel."""
    n = max(size // 8, 1)
    lat_raw = {k: _latency_loop(comm, k, n, waiter) for k in RAW_PATHS}
    lat_ch = _latency_loop(comm, "channel", n, waiter)
    it = iters if size <= 65536 else max(10, iters // 10)
    lat, lat_c = _rounds(comm, lat_raw, lat_ch, it, rounds)
    window = 64 if size <= 1 << 20 else 16
    reps = 10 if size <= 1 << 16 else 3
    bw_raw = {k: _bandwidth_loop(comm, k, n, window, waiter) for k in RAW_PATHS}
    bw_ch = _bandwidth_loop(comm, "channel", n, window, waiter)
    bw, bw_c = _rounds(comm, bw_raw, bw_ch, reps, rounds)
    for f in [*lat_raw.values(), lat_ch, *bw_raw.values(), bw_ch]:
        if hasattr(f, "free"):
            f.free()
    # the best raw path: lowest median latency, highest median bandwidth
    best_lat = min(RAW_PATHS, key=lambda k: median(lat[k]))
    best_bw = max(RAW_PATHS, key=lambda k: median(bw[k]))
    return {
        "bytes": size,
        "lat_send_recv_us": median(lat["send-recv"]) * 1e6,
        "lat_raw_us": median(lat[best_lat]) * 1e6,
        "lat_raw_path": best_lat,
        "lat_ch_us": median(lat_c) * 1e6,
        "lat_ratio": median([c / r for c, r in zip(lat_c, lat[best_lat])]),
        "bw_raw_MBs": median(bw[best_bw]) / 1e6,
        "bw_raw_path": best_bw,
        "bw_ch_MBs": median(bw_c) / 1e6,
        "bw_ratio": median([c / r for c, r in zip(bw_c, bw[best_bw])]),
        "sane": bool(np.isfinite(lat_c + bw_c).all() and min(lat_c) > 0 and min(bw_c) > 0),
    }


COLUMNS = [
    ("bytes", "bytes"),
    ("pair", "hosts"),
    ("lat_send_recv_us", "Send/Recv lat (us)"),
    ("lat_raw_path", "best raw"),
    ("lat_raw_us", "raw lat (us)"),
    ("lat_ch_us", "channel lat (us)"),
    ("lat_ratio", "lat ratio"),
    ("bw_raw_path", "best raw"),
    ("bw_raw_MBs", "raw bw (MB/s)"),
    ("bw_ch_MBs", "channel bw (MB/s)"),
    ("bw_ratio", "bw ratio"),
]


def rank_pairs(comm) -> list[tuple[int, int, str]]:
    """The rank pairs to measure: (rank 0, partner, ``host0-host1``), shared memory first.

    On 2 ranks, the pair (0, 1). On more ranks: rank 0 with the first other rank on
    its host (the shared-memory path) and with the first rank on another host (the
    network path), where such ranks exist.
    """
    import socket

    hosts = comm.allgather(socket.gethostname())
    if comm.size == 2:
        partners = [1]
    else:
        same = [r for r in range(1, comm.size) if hosts[r] == hosts[0]]
        other = [r for r in range(1, comm.size) if hosts[r] != hosts[0]]
        partners = same[:1] + other[:1]
    return [(0, r, f"{hosts[0]}-{hosts[r]}") for r in partners]


def bench_transport(
    comm, max_bytes: int, iters: int, wait: str, rounds: int = 5, min_bytes: int = 8
) -> int:
    """Latency and bandwidth of every size, for each pair of ``rank_pairs`` in turn.

    The pair under test has a communicator of its own; the other ranks wait in a
    barrier (they do not poll: MPI's progress on the pair is not shared).
    """
    from mpi4py import MPI

    from hpcpipe.pipeline.transport import Waiter

    pairs = rank_pairs(comm)
    if comm.size != 2 and (comm.size < 3 or len(pairs) < 2):
        if comm.rank == 0:
            print(
                "bench transport needs exactly 2 ranks (--np 2), or ranks on two hosts "
                "with two on the first (e.g. 2 per node on 2 nodes)"
            )
        return 2
    waiter = Waiter(wait, comm.size)
    rows = []
    for a, b, label in pairs:
        sub = comm.Split(0 if comm.rank in (a, b) else MPI.UNDEFINED, 0 if comm.rank == a else 1)
        if sub != MPI.COMM_NULL:
            for s in SIZES:
                if min_bytes <= s <= max_bytes:
                    rows.append({"pair": label, **transport_row(sub, s, iters, rounds, waiter)})
            sub.Free()
        comm.Barrier()
    what = (
        f"OSU-style loops: latency of {iters} back-to-back round trips (fewer above 64 KiB), "
        f"bandwidth of windows of 64 messages (16 above 1 MiB) with an ack; {rounds} rounds "
        f"alternating the raw paths ({', '.join(RAW_PATHS)}) and the channel (wait policy "
        f"{waiter.policy}); medians over rounds; ratio = channel / best raw path, per round; "
        f"pairs: {', '.join(f'ranks {a}-{b} on {label}' for a, b, label in pairs)}"
    )
    header(comm, what)
    return finish(comm, COLUMNS, rows, "transport", what)


def channel_latency(comm, n_doubles: int, iters: int) -> float:
    """One-way channel latency (s) between ranks 0 and 1, the others idle; on every rank."""
    from hpcpipe.pipeline.transport import Waiter

    sub = comm.Split(0 if comm.rank < 2 else 1, comm.rank)
    lat = 0.0
    if comm.rank < 2 and sub.size == 2:
        trips = _latency_loop(sub, "channel", n_doubles, Waiter("auto", comm.size))
        trips(10)
        lat = median([trips(iters) for _ in range(5)])
        trips.free()  # type: ignore[attr-defined]
    sub.Free()
    return float(comm.bcast(lat, root=0))
