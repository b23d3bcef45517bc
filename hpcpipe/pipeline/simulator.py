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
    """Timing of one schedule: makespan, per-rank end and busy time, every action's end.

    end_f[s, i] / end_b[s, i] / end_i[s, i] / end_w[s, i]: end of the F / B /
    I / W of item i on stage s (NaN where the stage does not run that kind;
    end_i and end_w are None from a kernel of a schedule of F and B only);
    ``ends[r]`` lists rank r's end times in its list order (with one stage
    per rank, rank r is stage r, and ``stage_end`` and ``busy`` are per stage
    as well). With ``record``, ``waits`` and ``readys`` are the rank
    clock before each action and the start of its compute.
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
    end_i: np.ndarray | None = None
    end_w: np.ndarray | None = None

    @property
    def by_kind(self) -> tuple[np.ndarray | None, ...]:
        return (self.end_f, self.end_b, self.end_i, self.end_w)

    @cached_property
    def ends(self) -> list[np.ndarray]:
        by_kind = self.by_kind
        n = self.schedule.n_items
        out = []
        for o in self.schedule.order:
            st = schedules.stages_of(o, n)
            codes = schedules.codes_of(o, n)
            k, i = schedules.kinds(codes), schedules.items(codes)
            e = np.empty(len(codes))
            for kind in schedules.Kind:
                mine = k == kind
                if mine.any():
                    e[mine] = by_kind[kind][st[mine], i[mine]]
            out.append(e)
        return out

    @property
    def bubble_fraction(self) -> float:
        """Share of rank-time idle: 1 − Σ_r busy_r / (R · makespan)."""
        R = len(self.busy)
        return 1.0 - sum(self.busy) / (R * self.makespan) if self.makespan > 0 else 0.0

    def peak_stash(self, item_bytes=None) -> list[float]:
        """Peak stashed activations per rank (items, or bytes with ``item_bytes`` per stage)."""
        return schedules.peak_stash(self.schedule, item_bytes)


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


def _fast(schedule, tf, tb, msg, ti, tw):
    """End times by kind (F, B, I, W), each rank's end (or None) and the method; or None
    when only the walk applies.

    Each kernel repeats the walk's floating-point operations in the same
    order (bitwise equal; tested): ``chain`` for sequential (costs >= 0, where
    the max provably picks the dependency), ``fill_drain`` for GPipe,
    ``one_f_one_b_steps`` for 1F1B, and ``rounds`` for any other schedule
    unless it is too serial. The built-in kernels run only on the lists their
    builder made (``Schedule.builders_lists``: the same read-only arrays). Costs
    must be finite: NaN compares differently in max() and in the walk, and the
    rounds kernel reads +inf as "not run yet".
    """
    n = schedule.n_items
    if not all(np.isfinite(a).all() for a in (tf, tb, msg, ti, tw)):
        return None
    own = schedule.one_stage_per_rank and schedule.builders_lists
    shape = schedule.shape if own and all(len(c) == 2 * n for c in schedule.codes) else ""
    fb = None
    if shape == "sequential" and min(tf.min(), tb.min(), msg.min(initial=0.0)) >= 0:
        fb = (*wavefront.chain(tf, tb, msg), "chain")
    if shape == "gpipe":
        fb = (*wavefront.fill_drain(tf, tb, msg, n), "fill-drain")
    if shape == "1f1b":
        fb = (*wavefront.one_f_one_b_steps(tf, tb, msg, n), "1f1b-steps")
    if fb is not None:
        return fb[0], fb[1], None, None, None, fb[2]
    if len(schedule) < SMALL:
        return None  # small enough for the walk
    try:
        by_kind, clock = wavefront.rounds_timing(schedule, tf, tb, msg, ti=ti, tw=tw)
    except (wavefront.TooSerial, schedules.ScheduleError):
        return None  # the walk times it, or names the deadlock
    return (*by_kind, clock.tolist(), "rounds")


def _last_ends(schedule, by_kind) -> list[float]:
    """End of each rank's last action (0.0 for an empty list), read from the tables."""
    n = schedule.n_items
    last = np.array([o[-1] if len(o) else -1 for o in schedule.order], dtype=np.int64)
    out = np.zeros(len(last))
    ran = last >= 0
    key, kind = schedules.keys_of(last[ran], n), schedules.kinds(last[ran])
    got = np.empty(len(key))
    for k, table in enumerate(by_kind):
        mine = kind == k
        if table is not None and mine.any():
            got[mine] = table[key[mine] // n, key[mine] % n]
    out[ran] = got
    return out.tolist()


def _busy(schedule, tf, tb, ti, tw, end_i=False) -> list[float]:
    """Busy time per rank: Σ over its stages of n(t_F + t_B), or n(t_F + t_I + t_W) on a
    stage that splits its backward (every item runs once per stage).

    A stage splits when it runs an I: ``end_i`` (the I end times, NaN where none
    ran; None when no stage runs one) says so without reading the lists again.
    """
    n = schedule.n_items
    if end_i is None:
        split = [False] * schedule.n_stages
    elif isinstance(end_i, np.ndarray):
        split = (~np.isnan(end_i)).any(axis=1).tolist()
    else:
        split = [bool(np.any(schedules.kinds(c) == schedules.Kind.INPUT)) for c in schedule.codes]
    per_stage = [
        n * (tf[s] + ti[s] + tw[s]) if split[s] else n * (tf[s] + tb[s])
        for s in range(schedule.n_stages)
    ]
    out = [0.0] * schedule.n_ranks
    for s, r in enumerate(schedule.placement):
        out[r] = per_stage[s] if out[r] == 0.0 else out[r] + per_stage[s]
    return [float(x) for x in out]


def simulate(
    schedule: schedules.Schedule,
    t_forward,
    t_backward,
    message=None,
    record: bool = False,
    method: str = "auto",
    t_input=None,
    t_weight=None,
) -> SimResult:
    """Time ``schedule`` with per-stage costs and per-(boundary, item) message costs.

    ``message`` is (S − 1) × n (nested lists or an array; anything that
    broadcasts to that shape, e.g. one column per boundary); a boundary
    between two stages of one rank costs nothing (a local copy). ``t_input``
    and ``t_weight`` are the costs of I and W (default: ``split_backward`` of
    t_B); a schedule with only B uses t_B. ``method="auto"`` uses a vectorised
    kernel where one applies and the reference walk (``schedules.walk``)
    otherwise; ``"walk"`` forces the walk. Both give the same floats bit for
    bit. ``record`` (waits and compute starts, for timelines) always walks.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r}: choose one of {', '.join(METHODS)}")
    S, n = schedule.n_stages, schedule.n_items
    tf = _stage_costs(t_forward, S, "t_forward")
    tb = _stage_costs(t_backward, S, "t_backward")
    if t_input is None or t_weight is None:
        ti, tw = schedules.split_backward(tb)
    else:
        ti, tw = _stage_costs(t_input, S, "t_input"), _stage_costs(t_weight, S, "t_weight")
    msg = _messages(message, S, n)
    fast = None if (record or method == "walk") else _fast(schedule, tf, tb, msg, ti, tw)
    if fast is not None:
        *by_kind, stage_end, how = fast
        busy = _busy(schedule, tf, tb, ti, tw, by_kind[2])
        if stage_end is None:
            stage_end = _last_ends(schedule, by_kind)
        return SimResult(
            schedule, max(stage_end), stage_end, busy, by_kind[0], by_kind[1], how,
            end_i=by_kind[2], end_w=by_kind[3],
        )  # fmt: skip
    busy = _busy(schedule, tf, tb, ti, tw, end_i=False)
    out = schedules.walk(schedule, tf, tb, msg, record, ti, tw)
    clock, ends = out[0], [np.asarray(e) for e in out[1]]
    by_kind = tuple(np.full((S, n), np.nan) for _ in schedules.Kind)
    for o, e in zip(schedule.order, ends):
        st, codes = schedules.stages_of(o, n), schedules.codes_of(o, n)
        k, i = schedules.kinds(codes), schedules.items(codes)
        for kind in schedules.Kind:
            m = k == kind
            by_kind[kind][st[m], i[m]] = e[m]
    res = SimResult(
        schedule, max(clock), list(clock), busy, by_kind[0], by_kind[1], "walk",
        end_i=by_kind[2], end_w=by_kind[3],
    )  # fmt: skip
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
    S = sch.n_stages  # n_stages ranks may hold more stages (interleaved, V)
    msg = np.full((max(S - 1, 0), 1), float(c))
    return simulate(sch, [t_f] * S, [t_b] * S, msg, record)


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
    """Per rank (= per stage with one stage per rank), (start, end, kind, item) cells
    for a timeline picture."""
    if res.readys is None:
        raise ValueError("simulate(..., record=True) is needed for a timeline")
    rows = []
    n = res.schedule.n_items
    for r, placed in enumerate(res.schedule.order):
        its, kds = schedules.decode_list(schedules.codes_of(placed, n))
        rows.append(
            [
                (res.readys[r][p], res.ends[r][p], schedules.Kind(k).letter, i)
                for p, (i, k) in enumerate(zip(its, kds))
            ]
        )
    return rows


def throughput(
    n_stages: int = 1024, n_items: int = 1024, name: str = "gpipe", seed: int = 0
) -> tuple[int, float, float, str, float]:
    """(actions, wall seconds, CPU seconds, kernel, build seconds) of one schedule.

    Per-stage costs and per-(boundary, item) message costs are random (no
    kernel depends on them being uniform). The clocks time one ``simulate``
    call on a freshly built schedule: everything the simulator does for it
    (cost checks, the choice of kernel, every table the kernel builds, the
    result); building the schedule comes before and is timed on its own
    (wall, the last figure). CPU time is this process's: on a shared machine
    the wall clock also counts waiting for a core, so the two differ by the
    load, not by threads (the simulator runs on one).
    """
    import time

    g = np.random.default_rng(seed)
    b0 = time.perf_counter()
    sch = schedules.build(name, n_stages, n_items)
    build = time.perf_counter() - b0
    S = sch.n_stages  # n_stages ranks may hold more stages (interleaved, V)
    tf, tb = g.uniform(0.5, 1.5, S), g.uniform(1.0, 3.0, S)
    msg = g.uniform(0.0, 0.2, (S - 1, n_items))
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sch, tf, tb, msg)
    return len(sch), time.perf_counter() - t0, time.process_time() - c0, res.method, build


__all__ = [
    "SimResult",
    "closed_form",
    "message_costs",
    "simulate",
    "simulate_uniform",
    "stage_times",
    "pipeline_speedup",
]
