"""Discrete-event simulator: times any schedule under a cost model, without MPI.

It runs the same ``Schedule`` objects as the engine, under the same
dependency rule as the validator (``schedules.dependency``), with the model
clock's rules (``clocks``): an action on stage s starts at max(stage clock,
end of the action it depends on + α + bytes·β) and lasts t_F[s] or t_B[s].
The reference is the dependency walk (``schedules.walk``); vectorised
kernels (``wavefront``) perform the same floating-point operations in the
same order for many actions per numpy call. Either way the result equals
the model clock of a real MPI run of the same configuration bit for bit
(tested), for any per-stage and per-message costs.

Closed forms for uniform costs (t_F, t_B per stage, message cost c = α + b·β
for every message) are kept with each schedule in the registry
(``schedules.SCHEDULES``) with how each was obtained, and checked against the
simulator and the MPI model clock by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hpcpipe.model.stages import partition
from hpcpipe.pipeline import schedules, wavefront
from hpcpipe.pipeline.clocks import CostModel

METHODS = ("auto", "walk")
SMALL = 4096  # actions: below this the walk is as fast as any kernel


@dataclass
class SimResult:
    """Timing of one schedule: makespan, per-stage end and busy time, every action's end.

    end_f[s, i] / end_b[s, i]: end of the forward / backward of item i on
    stage s; ``ends[s]`` lists stage s's end times in its list order. With
    ``record``, ``waits`` and ``readys`` are the stage clock before each
    action and the start of its compute.
    """

    schedule: schedules.Schedule
    makespan: float
    stage_end: list[float]
    busy: list[float]
    end_f: np.ndarray
    end_b: np.ndarray
    method: str = "walk"
    waits: list[list[float]] | None = None
    readys: list[list[float]] | None = None

    @cached_property
    def ends(self) -> list[np.ndarray]:
        by_kind = (self.end_f, self.end_b)
        out = []
        for s, codes in enumerate(self.schedule.codes):
            k, i = schedules.kinds(codes), schedules.items(codes)
            e = np.empty(len(codes))
            for kind in schedules.Kind:
                mine = k == kind
                e[mine] = by_kind[kind][s, i[mine]]
            out.append(e)
        return out

    @property
    def bubble_fraction(self) -> float:
        """Share of stage-time idle: 1 − Σ_s busy_s / (S · makespan)."""
        S = self.schedule.n_stages
        return 1.0 - sum(self.busy) / (S * self.makespan) if self.makespan > 0 else 0.0


def stage_times(costs: CostModel, depth: int, n_stages: int) -> tuple[list[float], list[float]]:
    """Per-stage (t_F, t_B): each stage's blocks' costs summed, as the engine does."""
    tf, tb = [], []
    for lo, hi in partition(depth, n_stages):
        f, b = costs.stage_costs(lo, hi)
        tf.append(f)
        tb.append(b)
    return tf, tb


def message_costs(
    costs: CostModel, boundary_widths: list[int], item_rows: list[int], itemsize: int = 8
) -> list[list[float]]:
    """c[s][i] = α + bytes·β for item i across boundary s (stage s to s+1).

    bytes = rows_i · width_s · itemsize: the payload the engine sends (the
    trailing clock stamp is not counted).
    """
    return [[costs.message(r * w * itemsize) for r in item_rows] for w in boundary_widths]


def _messages(message, S: int, n: int) -> np.ndarray:
    """Per-(boundary, item) message costs as an (S − 1, n) float array (maybe a broadcast view).

    Anything numpy broadcasts to (S − 1, n) is accepted: nested lists, a full
    array, one column (S − 1, 1) for costs that do not depend on the item, or
    a scalar; a broadcast costs no memory.
    """
    shape = (max(S - 1, 0), n)
    if message is None:
        return np.zeros(shape)
    m = np.asarray(message, dtype=np.float64)
    if shape[0] == 0 and m.size == 0:  # one stage: no boundary (e.g. [] from message_costs)
        return np.zeros(shape)
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ValueError(
            f"message costs have shape {m.shape}; expected (S - 1, n) = {shape}: one row per "
            "boundary between stages, one column per item (or one column for all items)"
        ) from None


def _stage_costs(t, S: int, what: str) -> np.ndarray:
    a = np.asarray(t, dtype=np.float64).reshape(-1)
    if a.shape != (S,):
        raise ValueError(f"{what} has {a.size} entries; expected one per stage ({S})")
    return a


def _fast(schedule, tf, tb, msg):
    """(end_f, end_b, method) by a vectorised kernel, or None when only the walk applies.

    Each kernel repeats the walk's floating-point operations in the same
    order (bitwise equal; tested): ``chain`` for sequential (costs >= 0, where
    the max provably picks the dependency), ``fill_drain`` for GPipe,
    ``one_f_one_b_steps`` for 1F1B, and ``rounds`` for any other schedule
    unless it is too serial. The built-in kernels run only on the exact lists
    their builder makes (checked).
    """
    S, n = schedule.n_stages, schedule.n_items
    if any(np.isnan(a).any() for a in (tf, tb, msg)):
        return None  # max() and the walk's comparison treat NaN differently
    shape = getattr(schedule, "shape", "")
    if shape == "sequential" and wavefront.same_lists(schedule, schedules.sequential(S, n)):
        if min(tf.min(), tb.min(), msg.min(initial=0.0)) >= 0:
            return (*wavefront.chain(tf, tb, msg), "chain")
    if shape == "gpipe" and wavefront.same_lists(schedule, schedules.gpipe(S, n)):
        return (*wavefront.fill_drain(tf, tb, msg, n), "fill-drain")
    if shape == "1f1b" and wavefront.same_lists(schedule, schedules.one_f_one_b(S, n)):
        return (*wavefront.one_f_one_b_steps(tf, tb, msg, n), "1f1b-steps")
    lengths = {len(c) for c in schedule.codes}
    if lengths != {schedules.n_codes(n)} or S * schedules.n_codes(n) < SMALL:
        return None  # incomplete (the walk reports it) or small enough for the walk
    try:
        return (*wavefront.rounds(schedule, tf, tb, msg), "rounds")
    except (wavefront.TooSerial, schedules.ScheduleError):
        return None  # the walk times it, or names the deadlock


def simulate(
    schedule: schedules.Schedule,
    t_forward,
    t_backward,
    message=None,
    record: bool = False,
    method: str = "auto",
) -> SimResult:
    """Time ``schedule`` with per-stage costs and per-(boundary, item) message costs.

    ``message`` is (S − 1) × n (nested lists or an array; anything that
    broadcasts to that shape, e.g. one column per boundary). ``method="auto"``
    uses a vectorised kernel where one applies and the reference walk
    (``schedules.walk``) otherwise; ``"walk"`` forces the walk. Both give the
    same floats bit for bit. ``record`` (waits and compute starts, for
    timelines) always walks.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r}: choose one of {', '.join(METHODS)}")
    S, n = schedule.n_stages, schedule.n_items
    tf = _stage_costs(t_forward, S, "t_forward")
    tb = _stage_costs(t_backward, S, "t_backward")
    msg = _messages(message, S, n)
    fast = None if (record or method == "walk") else _fast(schedule, tf, tb, msg)
    busy = (n * (tf + tb)).tolist()
    if fast is not None:
        end_f, end_b, how = fast
        last = np.array([c[-1] for c in schedule.codes])
        k, i, s = schedules.kinds(last), schedules.items(last), np.arange(S)
        stage_end = np.where(k == schedules.Kind.FORWARD, end_f[s, i], end_b[s, i]).tolist()
        return SimResult(schedule, max(stage_end), stage_end, busy, end_f, end_b, how)
    out = schedules.walk(schedule, tf, tb, msg, record)
    clock, ends = out[0], [np.asarray(e) for e in out[1]]
    by_kind = (np.full((S, n), np.nan), np.full((S, n), np.nan))
    for s, codes in enumerate(schedule.codes):
        k, i = schedules.kinds(codes), schedules.items(codes)
        for kind in schedules.Kind:
            by_kind[kind][s, i[k == kind]] = ends[s][k == kind]
    res = SimResult(schedule, max(clock), list(clock), busy, *by_kind, "walk")
    res.__dict__["ends"] = ends  # the walk's own lists (a cached property otherwise)
    if record:
        res.waits, res.readys = out[2], out[3]
    return res


def simulate_uniform(
    name: str,
    n_stages: int,
    n_items: int,
    t_f: float,
    t_b: float,
    c: float = 0.0,
    record: bool = False,
) -> SimResult:
    """Simulate a named schedule with the same costs on every stage and message."""
    sch = schedules.build(name, n_stages, n_items)
    msg = np.full((max(n_stages - 1, 0), 1), float(c))
    return simulate(sch, [t_f] * n_stages, [t_b] * n_stages, msg, record)


def closed_form(name: str, S: int, n: int, t_f: float, t_b: float, c: float = 0.0) -> float:
    """Makespan of a registered schedule with uniform costs, from its registry entry.

    The formulas and how each was obtained are in the builders' companions in
    ``schedules`` (``sequential_time``, ``gpipe_time``, ``one_f_one_b_time``:
    the last one's message term is empirical). Raises ValueError when the
    schedule has no closed form.
    """
    cf = schedules.entry(name).closed_form
    if cf is None:
        raise ValueError(f"no closed form for schedule {name!r}")
    return cf(S, n, t_f, t_b, c)


def pipeline_speedup(K: int, depth: int) -> float:
    """Speed-up of pipelining K items over depth Δ against the sequential schedule.

    Sequential pays K·Δ slots, GPipe K + Δ − 1: ratio K·Δ/(K + Δ − 1).
    """
    return K * depth / (K + depth - 1)


def gantt_rows(res: SimResult) -> list[list[tuple[float, float, str, int]]]:
    """Per stage, (start, end, kind, item) cells for a timeline picture."""
    if res.readys is None:
        raise ValueError("simulate(..., record=True) is needed for a timeline")
    rows = []
    for s, codes in enumerate(res.schedule.codes):
        its, kds = schedules.decode_list(codes)
        rows.append(
            [
                (res.readys[s][p], res.ends[s][p], schedules.Kind(k).letter, i)
                for p, (i, k) in enumerate(zip(its, kds))
            ]
        )
    return rows


def throughput(
    n_stages: int = 1024, n_items: int = 1024, name: str = "gpipe", seed: int = 0
) -> tuple[int, float, float, str]:
    """(actions, wall seconds, CPU seconds, kernel) to simulate one schedule.

    Per-stage costs and per-(boundary, item) message costs are random (no
    kernel depends on them being uniform); the schedule is built before the
    clocks start. CPU time is this process's; on a shared machine it shows
    the work when the wall clock also counts waiting for a core.
    """
    import time

    g = np.random.default_rng(seed)
    sch = schedules.build(name, n_stages, n_items)
    tf, tb = g.uniform(0.5, 1.5, n_stages), g.uniform(1.0, 3.0, n_stages)
    msg = g.uniform(0.0, 0.2, (n_stages - 1, n_items))
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sch, tf, tb, msg)
    return len(sch), time.perf_counter() - t0, time.process_time() - c0, res.method


__all__ = [
    "SimResult",
    "closed_form",
    "message_costs",
    "simulate",
    "simulate_uniform",
    "stage_times",
    "pipeline_speedup",
]
