"""The CPU that other processes used while a job measured: is the machine quiet?

A wall-clock measurement says what the model predicts only when the job had its cores to
itself. The 1-minute load average cannot tell: it counts the job's own ranks (32 ranks
that poll on 2 cores hold it near 32 on an otherwise idle machine), and it lags by about
a minute, so a run right after another one inherits its load. This module measures the
other processes directly, per host:

    foreign = (B(t₁) − B(t₀) − Σ_ranks [c_r(t₁) − c_r(t₀)]) / (t₁ − t₀)     (cores)

with B the host's busy CPU seconds from ``/proc/stat`` (user + nice + system + irq +
softirq + steal, over all its CPUs: time not idle, including time a hypervisor gave to
other machines) and c_r the CPU seconds (user + system, all threads) of each rank of
the job on that host (``os.times``). The job's launcher and the sweep driver, which
wait, count as foreign (a few ms). The result is the largest value over the job's hosts,
so a job on several nodes is quiet only when every node is. Where ``/proc/stat`` is
missing (not Linux) the figure is NaN and the callers fall back to the load average.
``/proc/stat`` counts clock ticks (10 ms per CPU), so over a span of t seconds the
figure is within about 2·cores·0.01/t cores: fine for the seconds a wall-clock study run
lasts, coarse for a run under a second.

A machine is busy for wall-clock verdicts when other processes used more than
``BUSY_SHARE`` of its cores on average (``busy``).
"""

from __future__ import annotations

import math
import os
import socket
import time

BUSY_SHARE = 0.25  # other processes above this share of the cores: a busy machine
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal


def host_busy_seconds(path: str = "/proc/stat") -> float:
    """Busy CPU seconds of this host since boot (all CPUs; ``/proc/stat``'s first line);
    NaN where the file does not exist or cannot be read."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return math.nan
    if not fields or fields[0] != "cpu":
        return math.nan
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    values = [int(v) for v in fields[1:]]
    return sum(values[i] for i in _BUSY_FIELDS if i < len(values)) / ticks


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads, at nanosecond
    resolution (``time.process_time``: ``os.times`` counts whole clock ticks, and 32 ranks
    each rounding by a tick misread a short run by a third of a core)."""
    return time.process_time()


def foreign_cores(busy: float, own: float, wall: float) -> float:
    """Cores used by other processes: (host busy − the job's own CPU) / wall; NaN when
    unknown. Clock-tick rounding can make a quiet host's figure slightly negative: it is
    kept as measured (never clipped), so the figure stays the measurement."""
    if not (math.isfinite(busy) and math.isfinite(own)) or wall <= 0:
        return math.nan
    return (busy - own) / wall


def busy(foreign: float, cores: int) -> bool:
    """Other processes used more than BUSY_SHARE of the cores (False when unknown)."""
    return math.isfinite(foreign) and foreign > BUSY_SHARE * cores


class ForeignLoad:
    """Measure the other processes' CPU over a span of a job (collective on ``comm``).

    ``ForeignLoad(comm)`` starts the span on every rank; ``stop()`` ends it and returns,
    on every rank, the largest foreign figure over the job's hosts (cores). With
    ``comm`` None the job is this process alone.
    """

    def __init__(self, comm=None, reader=host_busy_seconds) -> None:
        self.comm, self.reader = comm, reader
        self.host = socket.gethostname()
        if comm is not None and comm.size > 1:
            hosts = comm.allgather(self.host)
            self.leader = hosts.index(self.host) == comm.rank  # first rank of its host
            self.host_of = hosts
        else:
            self.leader, self.host_of = True, [self.host]
        self.busy0 = reader() if self.leader else math.nan
        self.cpu0 = own_cpu_seconds()
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        """The span's foreign cores: max over hosts (NaN when a host cannot tell)."""
        wall = time.perf_counter() - self.t0
        own = own_cpu_seconds() - self.cpu0
        busy_now = self.reader() - self.busy0 if self.leader else math.nan
        if self.comm is None or self.comm.size == 1:
            return foreign_cores(busy_now, own, wall)
        owns = self.comm.allgather(own)
        busies = self.comm.allgather(busy_now)
        values = []
        for host in dict.fromkeys(self.host_of):
            ranks = [r for r, h in enumerate(self.host_of) if h == host]
            values.append(foreign_cores(busies[ranks[0]], sum(owns[r] for r in ranks), wall))
        return max(values) if all(math.isfinite(v) for v in values) else math.nan


__all__ = [
    "BUSY_SHARE",
    "ForeignLoad",
    "busy",
    "foreign_cores",
    "host_busy_seconds",
    "own_cpu_seconds",
]
