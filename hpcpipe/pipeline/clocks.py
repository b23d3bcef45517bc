"""Clocks the engine runs on: the wall clock and the noise-free model clock.

Both expose the same calls, so one engine loop serves both:

* ``now()``: the rank's current time (seconds);
* ``tick()`` and ``origin``: the cheapest reading of the clock, with
  ``now() = tick() − origin`` (the engine subtracts ``origin`` once per call,
  on the whole event table, instead of once per reading);
* ``receive(stamp, nbytes)``: a message sent at ``stamp`` (sender's clock)
  with ``nbytes`` of payload has been received;
* ``compute(kind)``: the rank has executed an action of kind F, B, I or W.

Model clock (docs/design.md §2): an action costs its modelled t_F or t_B (the sum
over the stage's blocks), a message of n bytes costs α + n·β, and a receive
completes at max(local clock, send stamp + α + n·β). Sends do not occupy the
sender. Running the real engine on this clock gives the exact pipeline time
of the schedule under the cost model, free of machine noise.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """Per-block action costs and the message cost α + n·β (seconds, seconds/byte)."""

    t_forward: tuple[float, ...] = field(default=())
    t_backward: tuple[float, ...] = field(default=())
    alpha: float = 0.0
    beta: float = 0.0
    # share of a backward that is the weight gradient W (the rest is I):
    # t_W = share·t_B, t_I = t_B − t_W per stage (schedules.split_backward)
    weight_share: float = 0.5

    @classmethod
    def uniform(
        cls,
        depth: int,
        t_forward: float,
        t_backward: float | None = None,
        alpha: float = 0.0,
        beta: float = 0.0,
        weight_share: float = 0.5,
    ) -> CostModel:
        tb = t_forward if t_backward is None else t_backward
        return cls(
            (float(t_forward),) * depth,
            (float(tb),) * depth,
            float(alpha),
            float(beta),
            float(weight_share),
        )

    def stage_costs(self, lo: int, hi: int) -> tuple[float, float]:
        """(t_F, t_B) of a stage holding blocks [lo, hi): sums of its blocks' costs."""
        return float(sum(self.t_forward[lo:hi])), float(sum(self.t_backward[lo:hi]))

    def message(self, nbytes: int) -> float:
        return self.alpha + nbytes * self.beta

    def split(self, t_backward: float) -> tuple[float, float]:
        """(t_I, t_W) of a stage whose backward costs ``t_backward``."""
        tw = t_backward * self.weight_share
        return t_backward - tw, tw


class NoClock:
    """Timing off: no clock is read (every time is 0); for measuring the cost of timing."""

    name = "none"
    origin = 0.0
    tick = float  # float() is 0.0: a C call, cheaper than a Python method

    def reset(self) -> None:
        pass

    def now(self) -> float:
        return 0.0

    def receive(self, stamp: float, nbytes: int) -> None:
        pass

    def compute(self, kind: str) -> None:
        pass


class WallClock:
    """perf_counter seconds relative to an origin aligned across ranks."""

    name = "wall"

    tick = staticmethod(time.perf_counter)

    def __init__(self, origin: float = 0.0):
        self.origin = origin

    def reset(self) -> None:
        pass

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def receive(self, stamp: float, nbytes: int) -> None:
        pass

    def compute(self, kind: str) -> None:
        pass


class ModelClock:
    """Discrete model time of one stage; reset to 0 at the start of every call."""

    name = "model"

    def __init__(
        self,
        t_forward: float,
        t_backward: float,
        alpha: float,
        beta: float,
        t_input: float | None = None,
        t_weight: float | None = None,
    ):
        tb = float(t_backward)
        if t_input is None or t_weight is None:
            t_weight = tb * 0.5
            t_input = tb - t_weight
        self.cost = {"F": float(t_forward), "B": tb, "I": float(t_input), "W": float(t_weight)}
        self.alpha, self.beta = float(alpha), float(beta)
        self.t = 0.0
        self.origin = 0.0
        self.tick = self.now

    @classmethod
    def for_stage(cls, costs: CostModel, lo: int, hi: int) -> ModelClock:
        tf, tb = costs.stage_costs(lo, hi)
        return cls(tf, tb, costs.alpha, costs.beta, *costs.split(tb))

    def reset(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def receive(self, stamp: float, nbytes: int) -> None:
        arrival = stamp + (self.alpha + nbytes * self.beta)
        if arrival > self.t:
            self.t = arrival

    def compute(self, kind: str) -> None:
        self.t += self.cost[kind]

    def advance(self, seconds: float) -> None:
        """An action of ``seconds`` model time ran (a stage's cost of its kind)."""
        self.t += seconds


def align_wall_clocks(comm, rounds: int = 8) -> float:
    """Estimate this rank's perf_counter offset to rank 0; return the origin.

    A rank on rank 0's host reads the same clock when perf_counter is the kernel's
    CLOCK_MONOTONIC (Linux): its offset is 0 exactly. Any
    other rank ping-pongs with rank 0; the round with the smallest round-trip gives
    offset = t0 − (t_send + t_recv)/2 (Cristian's algorithm), whose error is up to
    half that round trip: milliseconds on an oversubscribed host (a 32-rank
    calibration on 2 cores, estimating on one host, measured a one-way latency of
    −1.3 ms). The returned origin makes ``perf_counter() − origin`` read rank 0's
    clock, started at 0 just after the barrier.
    """
    from mpi4py import MPI

    buf = np.zeros(1)
    # (host, perf_counter is CLOCK_MONOTONIC) of every rank: one collective, so rank 0 and
    # rank r agree on whether they ping-pong
    every = comm.allgather(
        (
            socket.gethostname(),
            "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation,
        )
    )
    same = [host == every[0][0] and mono and every[0][1] for host, mono in every]
    comm.Barrier()
    t0_origin = np.array([time.perf_counter()]) if comm.rank == 0 else np.zeros(1)
    comm.Bcast([t0_origin, MPI.DOUBLE], root=0)
    offset = 0.0
    for r in range(1, comm.size):
        if same[r]:
            continue
        if comm.rank == 0:
            for _ in range(rounds):
                comm.Recv([buf, MPI.DOUBLE], source=r, tag=7)
                buf[0] = time.perf_counter()
                comm.Send([buf, MPI.DOUBLE], dest=r, tag=8)
        elif comm.rank == r:
            best = np.inf
            for _ in range(rounds):
                ts = time.perf_counter()
                comm.Send([buf, MPI.DOUBLE], dest=0, tag=7)
                comm.Recv([buf, MPI.DOUBLE], source=0, tag=8)
                te = time.perf_counter()
                if te - ts < best:
                    best, offset = te - ts, buf[0] - (ts + te) / 2
    # local clock + offset = rank-0 clock; origin in local terms:
    return float(t0_origin[0] - offset)
