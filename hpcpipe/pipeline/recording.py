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
from hpcpipe.pipeline.schedules import codes_of, items, kinds, stages_of

N_FIELDS = 8  # iteration, rank, stage, kind, item, wait, start, end


class Recorder:
    def __init__(self, engine: Engine, limit: int, every: int, keep: bool = True):
        self.engine, self.limit, self.every, self.keep = engine, limit, every, keep
        codes = np.asarray(engine.codes, dtype=np.int64)
        self._static = np.zeros((len(codes), N_FIELDS))
        self._static[:, 1] = engine.rank
        self._static[:, 2] = engine.action_stages
        self._static[:, 3] = kinds(codes)
        self._static[:, 4] = items(codes)
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

    def restore(self, stage: np.ndarray, rank: int) -> None:
        """Continue the totals of a resumed run from its saved (S, 4) stage table."""
        self.busy, self.wait, self.idle = (float(x) for x in stage[rank, :3])
        self.actions = int(stage[rank, 3])


class SimulatedRecorder(Recorder):
    """The events of a simulated pipeline: all S stages, in this one process.

    Every call of a run has the same simulated timeline (``Timing``), so the
    per-stage totals add it once per call, and the per-action events of a
    recorded iteration are its copy (only for schedules of at most
    ``simulated.RECORD_LIMIT`` actions; larger ones keep the totals only).
    The per-action times are asked of the simulator at the first iteration
    the timeline keeps, so a run that keeps none (no output, or
    ``timeline_limit = 0`` with ``timeline_every`` above its iterations)
    never asks for them. The timeline's rank field holds the rank the
    schedule places the stage on (the stage itself with one stage per rank),
    and the totals are per rank.
    """

    def __init__(self, executor, limit: int, every: int, keep: bool = True):
        self.engine, self.limit, self.every, self.keep = executor, limit, every, keep
        self.timing = executor.timing
        S = executor.schedule.n_ranks
        self.busy, self.wait, self.idle = np.zeros(S), np.zeros(S), np.zeros(S)
        self.actions = np.zeros(S, dtype=np.int64)
        self.pending = []
        self._static: np.ndarray | None = None
        self._asked = False

    def _events(self) -> np.ndarray | None:
        """The call's per-action rows (iteration field 0), built on first use; None when
        the schedule is above ``simulated.RECORD_LIMIT`` actions."""
        if not self._asked:
            self._asked = True
            res = self.engine.recorded_timing().result
            if res is not None:
                parts = []
                n = self.engine.schedule.n_items
                for r, placed in enumerate(self.engine.schedule.order):
                    codes = codes_of(placed, n)
                    rows = np.zeros((len(codes), N_FIELDS))
                    rows[:, 1] = r
                    rows[:, 2] = stages_of(placed, n)
                    rows[:, 3] = kinds(codes)
                    rows[:, 4] = items(codes)
                    rows[:, 5], rows[:, 6], rows[:, 7] = res.waits[r], res.readys[r], res.ends[r]
                    parts.append(rows)
                self._static = np.concatenate(parts)
        return self._static

    def record(self, it: int, call_time: float) -> None:
        t = self.timing
        self.busy += t.busy
        self.wait += t.wait
        self.idle += t.idle
        self.actions += t.actions
        if self.keep and self.wants(it) and self._events() is not None:
            rows = self._static.copy()
            rows[:, 0] = it
            self.pending.append(rows)

    def gather(self, comm) -> np.ndarray:
        local = np.concatenate(self.pending) if self.pending else np.zeros((0, N_FIELDS))
        self.pending = []
        return local

    def stage_summary(self, comm) -> np.ndarray:
        return np.column_stack([self.busy, self.wait, self.idle, self.actions.astype(float)])

    def restore(self, stage: np.ndarray, rank: int) -> None:
        self.busy, self.wait, self.idle = (stage[:, j].copy() for j in range(3))
        self.actions = stage[:, 3].astype(np.int64)


def recorder_for(executor, limit: int, every: int, keep: bool = True) -> Recorder:
    """The recorder of an executor: per-rank events, or the simulated pipeline's timeline
    (an executor with a ``timing``: all stages in one process)."""
    cls = SimulatedRecorder if hasattr(executor, "timing") else Recorder
    return cls(executor, limit, every, keep)
