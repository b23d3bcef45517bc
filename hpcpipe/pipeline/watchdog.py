"""The watchdog: every wait of a run on a peer is bounded, and a lost peer is named.

With ``timeout`` = T > 0 s, each blocking MPI operation of the run path that waits on
another rank (point-to-point receives and sends, barriers, broadcasts, reductions and
gathers) becomes its nonblocking form completed by a Test loop with a deadline of T
seconds (``Watchdog.wait``). ``WatchedComm`` gives the collectives of a communicator
this form, so the runner, the engine's end-of-call collectives, the flush path and the
end-of-run gathers are all covered by wrapping the communicator once.

When a deadline passes, the rank does not know which peer is gone: a collective waits on
all of them, and a neighbour may itself be waiting on the lost rank. It then takes a
census on a private duplicate of the communicator: it sends one integer to every other
rank and listens for up to ``census_window`` = max(T, 1 s) seconds. Every live rank
whose own wait has expired does the same, so the live ranks hear each other; a rank
that is dead (its node lost), hung or stopped does not answer. The ranks not heard are
the lost ones. The lowest live rank reports one line naming each lost rank and its
host (``WatchdogTimeout`` with ``report`` set); the others stay silent and are ended by
its ``MPI_Abort``.

A live rank waits at most T before its census, and the last live rank to block does so
at most one iteration after the loss, so the ranks it must hear answer within T of each
other when T exceeds an iteration's time: the run ends within about 2 T of the loss.
This is a timeout-based failure detector (Chandra and Toueg, "Unreliable failure
detectors for reliable distributed systems", J. ACM 43(2), 1996): it may suspect a live
rank that is silent for longer than T (a stall), and never misses a lost one.

Default (``timeout`` = -1, "auto"): off, except in a Slurm job (``SLURM_JOB_ID`` set),
where T = max(``AUTO_FLOOR``, ``AUTO_FACTOR`` x the predicted iteration time), so that a
lost node ends the job within minutes rather than at its time limit.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

CENSUS_TAG = 31_415
CENSUS_FLOOR = 1.0  # seconds: the census listens at least this long, however short T is
AUTO_FLOOR = 60.0  # seconds: the automatic timeout is never shorter
AUTO_FACTOR = 50.0  # x the predicted iteration time, when that is longer


class WatchdogTimeout(RuntimeError):
    """A rank waited longer than the watchdog allows; ``report``: this rank prints the line
    (the lowest rank still alive), the others leave it to that rank."""

    def __init__(self, message: str, report: bool = True, lost: tuple[int, ...] = ()):
        super().__init__(message)
        self.report, self.lost = report, lost


def effective_timeout(setting: float, predicted_iteration: float = 0.0, env=None) -> float:
    """The watchdog's T in seconds from the ``timeout`` setting: > 0 as given, 0 off, and
    < 0 ("auto") off outside Slurm, max(AUTO_FLOOR, AUTO_FACTOR x predicted) in a job."""
    if setting >= 0:
        return float(setting)
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return 0.0
    return max(AUTO_FLOOR, AUTO_FACTOR * max(predicted_iteration, 0.0))


def _nothing() -> None:
    pass


class Watchdog:
    """Deadline logic and census of one communicator (created collectively, once)."""

    def __init__(self, comm, timeout: float):
        if timeout <= 0:
            raise ValueError(f"the watchdog needs a timeout > 0 s, got {timeout}")
        self.timeout = float(timeout)
        self.census_window = max(self.timeout, CENSUS_FLOOR)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.hosts: list[str] = comm.allgather(socket.gethostname())
        self.census_comm = comm.Dup()
        # a peer's failure seen by MPI must not abort this rank before it has reported
        self.census_comm.Set_errhandler(MPI.ERRORS_RETURN)

    def wait(self, test: Callable[[], bool], what: str, pause: Callable[[], None] = _nothing):
        """Call ``test`` (with ``pause`` between calls) until it is true, for at most T s."""
        end = time.monotonic() + self.timeout
        while not test():
            if time.monotonic() > end:
                self.expire(what)
            pause()

    def complete(self, req, what: str) -> None:
        """Complete one nonblocking request within T s, yielding the core between tests
        (ranks may outnumber cores; a collective's wait is off the per-action path)."""
        self.wait(req.Test, what, os.sched_yield)

    def census(self) -> list[int]:
        """The ranks that do not answer within the census window (see the module text)."""
        others = [r for r in range(self.size) if r != self.rank]
        if not others:
            return []
        c = self.census_comm
        mine = np.array([self.rank], dtype=np.int64)
        sends = []
        for r in others:
            try:
                sends.append(c.Isend([mine, MPI.INT64_T], r, CENSUS_TAG))
            except MPI.Exception:  # the library already knows r is gone
                pass
        heard: set[int] = set()
        got = np.zeros(1, dtype=np.int64)
        status = MPI.Status()
        end = time.monotonic() + self.census_window
        req = c.Irecv([got, MPI.INT64_T], MPI.ANY_SOURCE, CENSUS_TAG)
        while len(heard) < len(others) and time.monotonic() < end:
            try:
                done = req.Test(status)
            except MPI.Exception:
                done = False
            if done:
                heard.add(status.Get_source())
                req = c.Irecv([got, MPI.INT64_T], MPI.ANY_SOURCE, CENSUS_TAG)
            else:
                time.sleep(0.005)
        return [r for r in others if r not in heard]

    def expire(self, what: str):
        """A deadline passed while ``what``: take the census and raise WatchdogTimeout."""
        lost = self.census()
        alive = [r for r in range(self.size) if r not in lost]
        report = self.rank == min(alive)
        t = f"{self.timeout:g} s"
        if lost:
            names = ", ".join(f"rank {r} on {self.hosts[r]}" for r in lost)
            msg = (
                f"watchdog: lost {names} (no progress for {t}, no answer within "
                f"{self.census_window:g} s): {what}"
            )
        else:
            msg = f"watchdog: no progress for {t}, yet every rank answered (a stall): {what}"
        raise WatchdogTimeout(msg, report=report, lost=tuple(lost))


class WatchedComm:
    """A communicator whose blocking collectives are bounded by a Watchdog.

    Every other attribute is the wrapped communicator's. The buffer-API collectives and
    the blocking ``Send`` / ``Recv`` become their nonblocking forms; the object forms
    (``bcast``, ``gather``, ``allgather``: small values off the hot path) send their
    pickles through the nonblocking buffer collectives, a length first.
    """

    def __init__(self, comm, watchdog: Watchdog):
        self._comm, self.watchdog = comm, watchdog

    def __getattr__(self, name: str):
        return getattr(self._comm, name)

    @property
    def comm(self):
        """The wrapped communicator."""
        return self._comm

    def _done(self, req, what: str) -> None:
        self.watchdog.complete(req, f"rank {self.watchdog.rank} waits in {what}")

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        self._done(self._comm.Isend(buf, dest, tag), f"a send to rank {dest} on {self._host(dest)}")

    def Recv(self, buf, source: int, tag: int = 0) -> None:
        what = f"a receive from rank {source} on {self._host(source)}"
        self._done(self._comm.Irecv(buf, source, tag), what)

    def _host(self, rank: int) -> str:
        return self.watchdog.hosts[rank]

    def Barrier(self) -> None:
        self._done(self._comm.Ibarrier(), "a barrier")

    def Bcast(self, buf, root: int = 0) -> None:
        self._done(self._comm.Ibcast(buf, root), f"a broadcast from rank {root}")

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM) -> None:
        self._done(self._comm.Iallreduce(sendbuf, recvbuf, op), "an allreduce")

    def Allgather(self, sendbuf, recvbuf) -> None:
        self._done(self._comm.Iallgather(sendbuf, recvbuf), "an allgather")

    def Gather(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._done(self._comm.Igather(sendbuf, recvbuf, root), f"a gather to rank {root}")

    def Gatherv(self, sendbuf, recvbuf, root: int = 0) -> None:
        self._done(self._comm.Igatherv(sendbuf, recvbuf, root), f"a gather to rank {root}")

    def bcast(self, obj=None, root: int = 0):
        me = self._comm.Get_rank() == root
        data = pickle.dumps(obj) if me else b""
        n = np.array([len(data)], dtype=np.int64)
        self.Bcast([n, MPI.INT64_T], root)
        buf = np.frombuffer(data, dtype=np.uint8).copy() if me else np.empty(n[0], np.uint8)
        self.Bcast([buf, MPI.BYTE], root)
        return obj if me else pickle.loads(buf.tobytes())

    def gather(self, obj, root: int = 0):
        me, size = self._comm.Get_rank() == root, self._comm.Get_size()
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        n = np.array([data.size], dtype=np.int64)
        counts = np.zeros(size, dtype=np.int64) if me else None
        self.Gather([n, MPI.INT64_T], [counts, MPI.INT64_T] if me else None, root)
        out = np.empty(int(counts.sum()), np.uint8) if me else None
        recv = [out, counts.tolist(), MPI.BYTE] if me else None
        self.Gatherv([data, MPI.BYTE], recv, root)
        return _split(out, counts) if me else None

    def allgather(self, obj) -> list:
        size = self._comm.Get_size()
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        n = np.array([data.size], dtype=np.int64)
        counts = np.zeros(size, dtype=np.int64)
        self.Allgather([n, MPI.INT64_T], [counts, MPI.INT64_T])
        out = np.empty(int(counts.sum()), np.uint8)
        self._done(
            self._comm.Iallgatherv([data, MPI.BYTE], [out, counts.tolist(), MPI.BYTE]),
            "an allgather",
        )
        return _split(out, counts)


def _split(buf: np.ndarray, counts: np.ndarray) -> list:
    offs = np.concatenate([[0], np.cumsum(counts)])
    return [pickle.loads(buf[offs[i] : offs[i + 1]].tobytes()) for i in range(len(counts))]


def watched(comm, timeout: float):
    """``comm`` with its waits bounded by a ``timeout``-second watchdog (collective);
    ``comm`` itself when the timeout is 0 (off) or it runs on one rank."""
    if timeout <= 0 or comm is None or comm.Get_size() == 1 or isinstance(comm, WatchedComm):
        return comm
    return WatchedComm(comm, Watchdog(comm, timeout))


__all__ = [
    "AUTO_FACTOR",
    "AUTO_FLOOR",
    "Watchdog",
    "WatchdogTimeout",
    "WatchedComm",
    "effective_timeout",
    "watched",
]
