"""Pipeline schedules as data.

A schedule is, for each of S stages, the ordered list of actions that stage
executes for one oracle call over n work items: ``F(i)`` (forward of item i)
and ``B(i)`` (backward of item i). Actions print like torch.distributed
.pipelining's: ``2F0`` is stage 2, forward, item 0. The MPI engine executes a
schedule, the simulator times it and the visualiser draws it; none of them
contains schedule logic of its own.

Storage is compact so that millions of actions stay cheap: each stage's list
is an int64 array of codes ``2·item + kind`` (kind 0 = F, 1 = B);
``Schedule.actions`` gives the same lists as ``Action`` objects.

Data dependencies (the only ones a schedule may rely on):

* ``sF(i)`` needs ``(s-1)F(i)`` for s > 0 (the activation of item i);
* ``sB(i)`` needs ``(s+1)B(i)`` for s < S-1 (the gradient of item i) and,
  on every stage, ``sF(i)`` earlier in the same list (the stashed input);
* each stage runs its list in order.

Sends are nonblocking into per-item buffers and every receive is posted
before the call starts, so a rank only ever blocks on a missing input: a
schedule deadlocks exactly when these dependencies have a cycle.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

FORWARD = "F"
BACKWARD = "B"
KIND_CODE = {FORWARD: 0, BACKWARD: 1}


class ScheduleError(ValueError):
    """A schedule that is incomplete, out of dependency order, or deadlocks."""


@dataclass(frozen=True, slots=True)
class Action:
    """One action: stage ``stage`` runs the forward or backward of ``item``."""

    stage: int
    kind: str  # FORWARD or BACKWARD
    item: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.item}"

    @property
    def code(self) -> int:
        return 2 * self.item + KIND_CODE[self.kind]

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``'2F0'`` into ``Action(2, 'F', 0)``."""
        m = re.fullmatch(r"\s*(\d+)([FB])(\d+)\s*", text)
        if m is None:
            raise ScheduleError(f"cannot parse action {text!r}: expected e.g. '2F0' or '1B3'")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


def _action(stage: int, code: int) -> Action:
    return Action(stage, BACKWARD if code & 1 else FORWARD, code >> 1)


class Schedule:
    """Per-stage ordered action codes for ``n_stages`` stages and ``n_items`` items."""

    def __init__(self, name: str, n_stages: int, n_items: int, codes: Sequence[np.ndarray]):
        self.name, self.n_stages, self.n_items = name, n_stages, n_items
        self.codes = tuple(np.asarray(c, dtype=np.int64) for c in codes)
        self.wrong_stage: list[tuple[int, Action]] = []

    @classmethod
    def from_lists(
        cls, name: str, n_items: int, lists: Sequence[Sequence[Action | str]]
    ) -> Schedule:
        """Build a schedule from per-stage lists of actions or action strings."""
        acts = [[a if isinstance(a, Action) else Action.parse(a) for a in lst] for lst in lists]
        sch = cls(name, len(acts), n_items, [[a.code for a in lst] for lst in acts])
        sch.wrong_stage = [(s, a) for s, lst in enumerate(acts) for a in lst if a.stage != s]
        return sch

    @cached_property
    def actions(self) -> tuple[tuple[Action, ...], ...]:
        return tuple(tuple(_action(s, int(c)) for c in cs) for s, cs in enumerate(self.codes))

    def __len__(self) -> int:
        return sum(len(c) for c in self.codes)

    def validate(self) -> Schedule:
        """Raise ScheduleError naming the bad action; return self when valid."""
        validate(self)
        return self

    def render(self, actions_per_line: int | None = None) -> str:
        return render(self, actions_per_line)


# --------------------------------------------------------------------------
# builders (vectorised: S = n = 1024 builds in milliseconds)


def sequential(n_stages: int, n_items: int) -> Schedule:
    """No overlap: item i goes forward through all stages and back before i+1.

    This is the naive pipelining of GD/AGD in the paper: every item pays the
    whole depth. Each stage runs F0 B0 F1 B1 ...; the dependencies serialise
    the items.
    """
    _check_sizes(n_stages, n_items)
    codes = np.arange(2 * n_items, dtype=np.int64)  # 2i (F i), 2i+1 (B i)
    return Schedule("sequential", n_stages, n_items, [codes] * n_stages)


def gpipe(n_stages: int, n_items: int) -> Schedule:
    """Fill-drain (the paper's "bubbling"): all forwards, then all backwards."""
    _check_sizes(n_stages, n_items)
    i = np.arange(n_items, dtype=np.int64)
    codes = np.concatenate([2 * i, 2 * i + 1])
    return Schedule("gpipe", n_stages, n_items, [codes] * n_stages)


def one_f_one_b(n_stages: int, n_items: int) -> Schedule:
    """1F1B: stage s runs w = min(n, S-s-1) warm-up forwards, then alternates F/B.

    Order on stage s: F0..F(w-1), then F(w) B0 F(w+1) B1 ... until the
    forwards run out, then the remaining backwards. At most S - s items are
    in flight (forwarded, not yet backwarded) on stage s, so activation
    memory is bounded by the depth instead of by n as in GPipe.
    """
    _check_sizes(n_stages, n_items)
    lists = []
    for s in range(n_stages):
        w = min(n_items, n_stages - s - 1)
        steady = n_items - w
        warm = 2 * np.arange(w, dtype=np.int64)
        mid = np.empty(2 * steady, dtype=np.int64)
        mid[0::2] = 2 * np.arange(w, n_items, dtype=np.int64)
        mid[1::2] = 2 * np.arange(steady, dtype=np.int64) + 1
        cool = 2 * np.arange(steady, n_items, dtype=np.int64) + 1
        lists.append(np.concatenate([warm, mid, cool]))
    return Schedule("1f1b", n_stages, n_items, lists)


BUILDERS: dict[str, Callable[[int, int], Schedule]] = {
    "sequential": sequential,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}


def build(name: str, n_stages: int, n_items: int) -> Schedule:
    """Build the named schedule (``sequential``, ``gpipe`` or ``1f1b``)."""
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise ScheduleError(
            f"unknown schedule {name!r}: choose one of {', '.join(BUILDERS)}"
        ) from None
    return builder(n_stages, n_items)


def _check_sizes(n_stages: int, n_items: int) -> None:
    if n_stages < 1:
        raise ScheduleError(f"n_stages must be >= 1, got {n_stages}")
    if n_items < 1:
        raise ScheduleError(f"n_items must be >= 1, got {n_items}")


# --------------------------------------------------------------------------
# the dependency walk: one loop for deadlock detection and for timing


def dependencies(a: Action, n_stages: int) -> tuple[Action, ...]:
    """Actions on *other* stages whose messages ``a`` waits for."""
    if a.kind == FORWARD:
        return (Action(a.stage - 1, FORWARD, a.item),) if a.stage > 0 else ()
    return (Action(a.stage + 1, BACKWARD, a.item),) if a.stage < n_stages - 1 else ()


def walk(
    schedule: Schedule,
    t_forward: Sequence[float] | None = None,
    t_backward: Sequence[float] | None = None,
    message: Sequence[Sequence[float]] | None = None,
    record: bool = False,
):
    """Run the schedule's dependency graph, timing it under a cost model.

    Every stage advances until its next action waits for a message that has
    not been produced; it is woken when that message's producer runs. With
    per-stage costs t_F[s], t_B[s] and per-(boundary, item) message costs
    c[s][i] (boundary s is between stages s and s+1), an action's times are
    exactly those of the engine on the model clock:

        ready = max(t_stage, end(dependency) + c),  end = ready + t_kind.

    Returns (stage_end_times, ends) where ends[s] lists each action's end
    time in list order; with ``record`` also (waits, readys). Raises
    ScheduleError naming the blocked actions when the stages wedge. Linear
    in the number of actions.
    """
    S, n = schedule.n_stages, schedule.n_items
    tf = [0.0] * S if t_forward is None else [float(x) for x in t_forward]
    tb = [0.0] * S if t_backward is None else [float(x) for x in t_backward]
    zero = [0.0] * n
    msg = [zero] * max(S - 1, 0) if message is None else [list(map(float, m)) for m in message]
    lists = [c.tolist() for c in schedule.codes]
    end_f: list[list] = [[None] * n for _ in range(S)]
    end_b: list[list] = [[None] * n for _ in range(S)]
    ends: list[list[float]] = [[] for _ in range(S)]
    waits: list[list[float]] = [[] for _ in range(S)]
    readys: list[list[float]] = [[] for _ in range(S)]
    wait_f = [-1] * S  # item whose forward message stage s is waiting for
    wait_b = [-1] * S
    pos = [0] * S
    clock = [0.0] * S
    ready_stack = list(range(S - 1, -1, -1))
    last = S - 1
    none: list = []
    # everything a stage's actions look up, built once: one tuple unpack per visit
    ctx = [
        (
            lists[s],
            end_f[s],
            end_b[s],
            ends[s],
            waits[s],
            readys[s],
            s > 0,
            s < last,
            end_f[s - 1] if s > 0 else none,
            end_b[s + 1] if s < last else none,
            msg[s - 1] if s > 0 else none,
            msg[s] if s < last else none,
            tf[s],
            tb[s],
            len(lists[s]),
        )
        for s in range(S)
    ]
    while ready_stack:
        s = ready_stack.pop()
        (codes, ef, eb, out, ws, rs, up, down, prev_f, next_b, msg_up, msg_down, tf_s, tb_s, L) = (
            ctx[s]
        )
        p, t = pos[s], clock[s]
        wake_f, wake_b = wait_f, wait_b
        while p < L:
            c = codes[p]
            i = c >> 1
            w = t
            if c & 1 == 0:
                if up:
                    e = prev_f[i]
                    if e is None:
                        wait_f[s] = i
                        break
                    e += msg_up[i]
                    if e > t:
                        t = e
                r = t
                t += tf_s
                ef[i] = t
                if down and wake_f[s + 1] == i:
                    wake_f[s + 1] = -1
                    ready_stack.append(s + 1)
            else:
                if down:
                    e = next_b[i]
                    if e is None:
                        wait_b[s] = i
                        break
                    e += msg_down[i]
                    if e > t:
                        t = e
                r = t
                t += tb_s
                eb[i] = t
                if up and wake_b[s - 1] == i:
                    wake_b[s - 1] = -1
                    ready_stack.append(s - 1)
            out.append(t)
            if record:
                ws.append(w)
                rs.append(r)
            p += 1
        pos[s], clock[s] = p, t
    if any(pos[s] < len(lists[s]) for s in range(S)):
        blocked = []
        for s in range(S):
            if pos[s] < len(lists[s]):
                a = _action(s, lists[s][pos[s]])
                deps = ", ".join(str(d) for d in dependencies(a, S))
                blocked.append(f"stage {s} waits at {a} for {deps}")
        raise ScheduleError("schedule deadlocks: " + "; ".join(blocked))
    if record:
        return clock, ends, waits, readys
    return clock, ends


def execution_order(schedule: Schedule) -> list[Action]:
    """A global order in which every action's inputs are ready (a topological order).

    Under unit costs and no messages, sorting all actions by end time (ties by
    stage) respects every dependency, since a dependency ends strictly earlier.
    """
    S = schedule.n_stages
    _, ends = walk(schedule, [1.0] * S, [1.0] * S)
    acts = [(ends[s][p], s, p) for s in range(S) for p in range(len(ends[s]))]
    acts.sort()
    return [schedule.actions[s][p] for _, s, p in acts]


def validate(schedule: Schedule) -> None:
    """Check completeness, same-stage order (F before B) and freedom from deadlock."""
    S, n = schedule.n_stages, schedule.n_items
    if S < 1 or n < 1:
        raise ScheduleError(f"schedule needs >= 1 stage and item, got {S} stages, {n} items")
    if len(schedule.codes) != S:
        raise ScheduleError(f"schedule has {len(schedule.codes)} stage lists for {S} stages")
    if schedule.wrong_stage:
        s, a = schedule.wrong_stage[0]
        raise ScheduleError(f"action {a} is in the list of stage {s}")
    for s, codes in enumerate(schedule.codes):
        bad = np.flatnonzero((codes < 0) | (codes >= 2 * n))
        if bad.size:
            a = _action(s, int(codes[bad[0]]))
            raise ScheduleError(f"action {a} names item {a.item}, outside 0..{n - 1}")
        counts = np.bincount(codes, minlength=2 * n)
        dup = np.flatnonzero(counts > 1)
        if dup.size:
            raise ScheduleError(f"action {_action(s, int(dup[0]))} appears twice on stage {s}")
        where = np.full(2 * n, -1, dtype=np.int64)
        where[codes] = np.arange(len(codes))
        pf, pb = where[0::2], where[1::2]
        early = np.flatnonzero((pb >= 0) & (pf >= 0) & (pb < pf))
        orphan = np.flatnonzero((pb >= 0) & (pf < 0))
        first = [int(x) for x in (early[:1].tolist() + orphan[:1].tolist())]
        if first:
            i = min(first, key=lambda x: pb[x])
            raise ScheduleError(f"action {s}B{i} comes before its forward {s}F{i} on stage {s}")
        missing = np.flatnonzero(counts == 0)
        if missing.size:
            raise ScheduleError(f"missing action {_action(s, int(missing[0]))} on stage {s}")
    walk(schedule)


def render(schedule: Schedule, actions_per_line: int | None = None) -> str:
    """The per-stage action table, one row per stage, like torch's pipeline printer."""
    acts = schedule.actions
    width = max((len(str(a)) for lst in acts for a in lst), default=3)
    rows = [
        f"{schedule.name}: {schedule.n_stages} stages, {schedule.n_items} items, "
        f"{len(schedule)} actions"
    ]
    for s, lst in enumerate(acts):
        cells = [str(a).rjust(width) for a in lst]
        if actions_per_line and len(cells) > actions_per_line:
            cells = cells[:actions_per_line] + ["..."]
        rows.append(f"stage {s:>3} | " + " ".join(cells))
    return "\n".join(rows)


def max_in_flight(schedule: Schedule) -> list[int]:
    """Largest number of items forwarded but not yet backwarded, per stage."""
    return [int(np.max(np.cumsum(1 - 2 * (c & 1)), initial=0)) for c in schedule.codes]
