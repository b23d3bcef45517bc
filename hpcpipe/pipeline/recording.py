"""Per-action events of a run: what each rank recorded, bounded in memory.

The engine fills a preallocated (actions, 3) array per call: the time the
action began waiting for its input, the time the input was there (start of
compute) and the end. This module keeps those of selected iterations (all of
the first ``limit``, then every ``every``-th), accumulates per-stage busy /
wait / idle over all iterations, and gathers events to rank 0 with the
buffer API at each flush.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from hpcpipe.pipeline.engine import EV_END, EV_READY, EV_WAIT, Engine

N_FIELDS = 8  # iteration, rank, stage, kind, item, wait, start, end


class Recorder:
    def __init__(self, engine: Engine, limit: int, every: int, keep: bool = True):
        self.engine, self.limit, self.every, self.keep = engine, limit, every, keep
        codes = np.asarray(engine.codes, dtype=np.int64)
        self._static = np.zeros((len(codes), N_FIELDS))
        self._static[:, 1] = engine.rank
        self._static[:, 2] = engine.rank
        self._static[:, 3] = codes & 1
        self._static[:, 4] = codes >> 1
        self.pending: list[np.ndarray] = []
        self.busy = self.wait = self.idle = 0.0
        self.actions = 0

    def wants(self, it: int) -> bool:
        return it <= self.limit or it % self.every == 0

    def record(self, it: int, call_time: float) -> None:
        ev = self.engine.events
        busy = float((ev[:, EV_END] - ev[:, EV_READY]).sum())
        wait = float((ev[:, EV_READY] - ev[:, EV_WAIT]).sum())
        self.busy += busy
        self.wait += wait
        self.idle += max(call_time - busy - wait, 0.0)
        self.actions += len(ev)
        if self.keep and self.wants(it):
            rows = self._static.copy()
            rows[:, 0] = it
            rows[:, 5:8] = ev
            self.pending.append(rows)

    def gather(self, comm) -> np.ndarray | None:
        """All ranks' pending events on rank 0 (None elsewhere); clears them."""
        local = np.concatenate(self.pending) if self.pending else np.zeros((0, N_FIELDS))
        self.pending = []
        counts = np.array(comm.gather(local.size, root=0) if comm.size > 1 else [local.size])
        if comm.size == 1:
            return local
        out = np.empty(int(counts.sum())) if comm.rank == 0 else None
        recv = [out, counts.tolist(), MPI.DOUBLE] if comm.rank == 0 else None
        comm.Gatherv([local.ravel(), MPI.DOUBLE], recv, root=0)
        return out.reshape(-1, N_FIELDS) if comm.rank == 0 else None

    def stage_summary(self, comm) -> np.ndarray | None:
        """(S, 4) busy, wait, idle, actions per stage on rank 0."""
        mine = np.array([self.busy, self.wait, self.idle, float(self.actions)])
        out = np.empty((comm.size, 4)) if comm.rank == 0 else None
        comm.Gather([mine, MPI.DOUBLE], [out, MPI.DOUBLE] if comm.rank == 0 else None, root=0)
        return out
