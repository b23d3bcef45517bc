"""Point-to-point channels between neighbouring stages.

Each direction to each neighbour has one preallocated contiguous float64
buffer, sliced into one message per work item, and one persistent request
per item (``Send_init`` / ``Recv_init``, tag = the sending action's code, plus
``tag_base`` naming the boundary when a rank pair shares several). A message
is the item's activation (or gradient) rows followed by one float64 holding
the sender's clock stamp, so the model clock travels with the data in the
same message. All receives of a call are started before its first action;
sends start when their action ends and are completed with ``Waitall`` at the
end of the call, so nothing is ever pickled and no action blocks on a send.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from hpcpipe.machine.cores import cores
from hpcpipe.pipeline.schedules import Kind, encode
from hpcpipe.pipeline.wait import WAIT_POLICIES
from hpcpipe.pipeline.watchdog import Watchdog, WatchdogTimeout

__all__ = ["BWD", "FWD", "Channel", "Waiter", "WatchdogTimeout", "tag"]

# a message travels with the kind of action that sends it: activations with
# forwards, gradients with backwards
FWD, BWD = int(Kind.FORWARD), int(Kind.BACKWARD)


def tag(item: int, direction: int) -> int:
    """The message tag of item's activation (FWD) or gradient (BWD): its sender's action code."""
    return int(encode(item, direction))


class Channel:
    """Per-item buffers and persistent requests for one (peer, direction, send|recv)."""

    def __init__(
        self,
        comm,
        peer: int,
        direction: int,
        sending: bool,
        rows: list[int],
        width: int,
        tag_base: int = 0,
    ):
        self.sizes = [r * width for r in rows]
        self.offsets = np.concatenate([[0], np.cumsum([s + 1 for s in self.sizes])]).astype(int)
        self.buffer = np.zeros(int(self.offsets[-1]), dtype=np.float64)
        self.width = width
        self.slots = [self.buffer[self.offsets[i] : self.offsets[i + 1]] for i in range(len(rows))]
        self.rows = rows
        init = comm.Send_init if sending else comm.Recv_init
        self.requests = [
            init([slot, MPI.DOUBLE], peer, tag_base + tag(i, direction))
            for i, slot in enumerate(self.slots)
        ]

    def payload(self, item: int) -> np.ndarray:
        """The item's data as a (rows, width) view of the buffer."""
        return self.slots[item][:-1].reshape(self.rows[item], self.width)

    def nbytes(self, item: int) -> int:
        return self.sizes[item] * 8

    def free(self) -> None:
        for r in self.requests:
            r.Free()
        self.requests = []


class Waiter:
    """Completes a request under a wait policy, optionally with a watchdog.

    ``busy``: MPI Wait (the library spins); ``yield``: Test then
    sched_yield; ``sleep``: Test then sleep ``interval`` seconds. ``auto``
    picks busy when ranks <= cores, else yield, so that oversubscribed ranks
    (4-8 ranks on 2 cores) give their core to the rank that has work without
    oversleeping: measured on 2 cores, 4 ranks, GPipe step of a width-64 MLP,
    M = 16: yield 2.46 ms, sleep 3.86 ms, busy 3.57 ms; at width 256 and 1024
    and on 8 ranks yield is as fast as sleep or faster. With
    ``timeout`` > 0 every wait polls (busy becomes a Test loop) and raises
    WatchdogTimeout naming the message after ``timeout`` seconds; with a ``watchdog``
    (``hpcpipe.pipeline.watchdog``) its deadline and census name the lost ranks.
    """

    def __init__(
        self,
        policy: str = "auto",
        n_ranks: int = 1,
        interval: float = 50e-6,
        timeout: float = 0.0,
        watchdog: Watchdog | None = None,
    ):
        if policy not in WAIT_POLICIES:
            raise ValueError(f"wait policy {policy!r}: choose one of {', '.join(WAIT_POLICIES)}")
        if policy == "auto":
            policy = "busy" if n_ranks <= cores() else "yield"
        self.policy, self.interval, self.timeout = policy, interval, float(timeout)
        self.watchdog = watchdog

    def _pause(self) -> None:
        if self.policy == "sleep":
            time.sleep(self.interval)
        elif self.policy == "yield":
            os.sched_yield()

    def wait(self, req, what: str = "waiting for a message") -> None:
        if self.watchdog is not None:
            self.watchdog.wait(req.Test, what, self._pause)
        elif self.timeout > 0:
            end = time.monotonic() + self.timeout
            while not req.Test():
                if time.monotonic() > end:
                    raise WatchdogTimeout(f"no progress for {self.timeout:g} s: {what}")
                self._pause()
        elif self.policy == "busy":
            req.Wait()
        else:
            while not req.Test():
                self._pause()

    def waitall(self, reqs, what: str = "waiting for sends to complete") -> None:
        if not reqs:
            return
        if self.watchdog is not None:
            self.watchdog.wait(lambda: MPI.Request.Testall(reqs), what, self._pause)
        elif self.timeout > 0:
            end = time.monotonic() + self.timeout
            while not MPI.Request.Testall(reqs):
                if time.monotonic() > end:
                    raise WatchdogTimeout(f"no progress for {self.timeout:g} s: {what}")
                self._pause()
        elif self.policy == "busy":
            MPI.Request.Waitall(reqs)
        else:
            while not MPI.Request.Testall(reqs):
                self._pause()
