"""Pipeline schedules as data.

A schedule is, for each of S stages, the ordered list of actions that stage
executes for one oracle call over n work items: ``F(i)`` (forward of item i)
and ``B(i)`` (backward of item i). Actions print like torch.distributed
.pipelining's: ``2F0`` is stage 2, forward, item 0. The MPI engine executes a
schedule, the simulator times it and the visualiser draws it; none of them
contains schedule logic of its own. ``SCHEDULES`` is the registry of
builders (with their closed forms); ``register_schedule`` adds one.

Storage is compact so that millions of actions stay cheap: each stage's list
is an int64 array of action codes; ``encode``, ``kinds`` and ``items``
(vectorised) are the only code that knows how a code packs (item, ``Kind``).
``Schedule.actions`` gives the same lists as ``Action`` objects.

Data dependencies (the only ones a schedule may rely on; ``dependency`` is
the one statement of this rule, read by the validator, the simulator and the
error messages):

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
from enum import IntEnum
from functools import cached_property

import numpy as np

from hpcpipe.registry import Registry, RegistryError


class Kind(IntEnum):
    """What an action does to its item. Its value is the low part of an action code."""

    FORWARD = 0
    BACKWARD = 1

    @property
    def letter(self) -> str:
        return "FB"[self]

    @classmethod
    def parse(cls, letter: str) -> Kind:
        return cls("FB".index(letter))


FORWARD, BACKWARD = Kind.FORWARD.letter, Kind.BACKWARD.letter
N_KINDS = len(Kind)

# --------------------------------------------------------------------------
# the action code: code = N_KINDS·item + kind. Only these functions know it.


def encode(items, kinds):
    """Action codes of (item, kind) pairs (scalars or arrays)."""
    return N_KINDS * items + kinds


def kinds(codes):
    """The kind (a ``Kind`` value) of each action code."""
    return codes % N_KINDS


def items(codes):
    """The item of each action code."""
    return codes // N_KINDS


def n_codes(n_items: int) -> int:
    """Number of distinct codes for ``n_items`` items (codes are 0 .. n_codes - 1)."""
    return N_KINDS * n_items


def per_kind(by_code: np.ndarray) -> tuple[np.ndarray, ...]:
    """Views (one per ``Kind``, shape (S, n)) of an (S, n_codes) array indexed by action code."""
    v = by_code.reshape(by_code.shape[0], -1, N_KINDS)
    return tuple(v[:, :, k] for k in Kind)


def decode_list(codes: np.ndarray) -> tuple[list[int], list[int]]:
    """(items, kinds) of a stage's action list as Python lists (for per-action loops)."""
    codes = np.asarray(codes, dtype=np.int64)
    return items(codes).tolist(), kinds(codes).tolist()


# --------------------------------------------------------------------------
# the dependency rule: the only place that says which message an action waits for

# kind -> (stage offset of the producer, kind of the producer's action)
DEPENDENCY = {Kind.FORWARD: (-1, Kind.FORWARD), Kind.BACKWARD: (+1, Kind.BACKWARD)}


def dependency(stage: int, kind: int, n_stages: int) -> tuple[int, Kind] | None:
    """(stage, kind) of the action on another stage whose message this action waits for.

    The item is the same. ``sF(i)`` waits for ``(s-1)F(i)`` (the activation),
    ``sB(i)`` for ``(s+1)B(i)`` (the gradient); the first stage's forwards and
    the last stage's backwards wait for nothing (None). On its own stage, an
    action also waits for the previous action of the list and ``sB(i)`` needs
    ``sF(i)`` earlier in the list (checked by ``validate``).
    """
    offset, dep_kind = DEPENDENCY[Kind(kind)]
    s = stage + offset
    return (s, dep_kind) if 0 <= s < n_stages else None


def consumer(stage: int, kind: int, n_stages: int) -> int | None:
    """The stage whose action of the same kind and item waits for this action's message."""
    offset, _ = DEPENDENCY[Kind(kind)]
    s = stage - offset
    return s if 0 <= s < n_stages else None


def boundary(stage: int, other: int) -> int:
    """Index of the link between neighbouring stages (link s joins stages s and s+1)."""
    return min(stage, other)


class ScheduleError(ValueError):
    """A schedule that is incomplete, out of dependency order, or deadlocks."""


@dataclass(frozen=True, slots=True)
class Action:
    """One action: stage ``stage`` runs the forward or backward of ``item``."""

    stage: int
    kind: str  # FORWARD or BACKWARD (a Kind's letter)
    item: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.item}"

    @property
    def code(self) -> int:
        return int(encode(self.item, Kind.parse(self.kind)))

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``'2F0'`` into ``Action(2, 'F', 0)``."""
        m = re.fullmatch(r"\s*(\d+)([FB])(\d+)\s*", text)
        if m is None:
            raise ScheduleError(f"cannot parse action {text!r}: expected e.g. '2F0' or '1B3'")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))

    @classmethod
    def of(cls, stage: int, code: int) -> Action:
        """The action of ``code`` on ``stage``."""
        return cls(stage, Kind(int(kinds(code))).letter, int(items(code)))

    def dependencies(self, n_stages: int) -> tuple[Action, ...]:
        """Actions on *other* stages whose messages this action waits for."""
        dep = dependency(self.stage, Kind.parse(self.kind), n_stages)
        return () if dep is None else (Action(dep[0], dep[1].letter, self.item),)


def _action(stage: int, code: int) -> Action:
    return Action.of(stage, code)


class Schedule:
    """Per-stage ordered action codes for ``n_stages`` stages and ``n_items`` items."""

    def __init__(
        self,
        name: str,
        n_stages: int,
        n_items: int,
        codes: Sequence[np.ndarray],
        shape: str = "",
    ):
        self.name, self.n_stages, self.n_items = name, n_stages, n_items
        self.codes = tuple(np.asarray(c, dtype=np.int64) for c in codes)
        self.wrong_stage: list[tuple[int, Action]] = []
        # the built-in builder that made these lists ("" otherwise): the simulator
        # then tries that builder's kernel, after checking the lists are still its own
        self.shape = shape

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
        return tuple(tuple(Action.of(s, int(c)) for c in cs) for s, cs in enumerate(self.codes))

    def __len__(self) -> int:
        return sum(len(c) for c in self.codes)

    def validate(self) -> Schedule:
        """Raise ScheduleError naming the bad action; return self when valid."""
        validate(self)
        return self

    def render(self, actions_per_line: int | None = None) -> str:
        return render(self, actions_per_line)


# --------------------------------------------------------------------------
# builders (vectorised: S = n = 1024 builds in milliseconds) and their closed forms


def _i(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, n, dtype=np.int64)


def sequential(n_stages: int, n_items: int) -> Schedule:
    """No overlap: item i goes forward through all stages and back before i+1.

    This is the naive pipelining of GD/AGD in the paper: every item pays the
    whole depth. Each stage runs F0 B0 F1 B1 ...; the dependencies serialise
    the items.
    """
    _check_sizes(n_stages, n_items)
    codes = np.empty(n_codes(n_items), dtype=np.int64)
    codes[0::2] = encode(_i(n_items), Kind.FORWARD)
    codes[1::2] = encode(_i(n_items), Kind.BACKWARD)
    return Schedule("sequential", n_stages, n_items, [codes] * n_stages, "sequential")


def gpipe(n_stages: int, n_items: int) -> Schedule:
    """Fill-drain (the paper's "bubbling"): all forwards, then all backwards."""
    _check_sizes(n_stages, n_items)
    i = _i(n_items)
    codes = np.concatenate([encode(i, Kind.FORWARD), encode(i, Kind.BACKWARD)])
    return Schedule("gpipe", n_stages, n_items, [codes] * n_stages, "gpipe")


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
        mid = np.empty(2 * steady, dtype=np.int64)
        mid[0::2] = encode(_i(n_items, w), Kind.FORWARD)
        mid[1::2] = encode(_i(steady), Kind.BACKWARD)
        warm = encode(_i(w), Kind.FORWARD)
        cool = encode(_i(n_items, steady), Kind.BACKWARD)
        lists.append(np.concatenate([warm, mid, cool]))
    return Schedule("1f1b", n_stages, n_items, lists, "1f1b")


def sequential_time(S: int, n: int, t_f: float, t_b: float, c: float = 0.0) -> float:
    """Each item crosses S stages and S − 1 links each way before the next starts.

    T = n · (S(t_F + t_B) + 2(S − 1)c).
    """
    return n * (S * (t_f + t_b) + 2 * (S - 1) * c)


def gpipe_time(S: int, n: int, t_f: float, t_b: float, c: float = 0.0) -> float:
    """T = (n + S − 1)(t_F + t_B) + 2(S − 1)c.

    By induction on the recurrence E_F(s,i) = max(E_F(s,i−1), E_F(s−1,i) + c)
    + t_F, the forward of item i ends on stage s at (s + i + 1)t_F + s·c (both
    arguments of the max are equal); the backward mirrors it from the last
    stage, starting at E_F(S−1, n−1).
    """
    return (n + S - 1) * (t_f + t_b) + 2 * (S - 1) * c


def one_f_one_b_time(S: int, n: int, t_f: float, t_b: float, c: float = 0.0) -> float:
    """T = (n + S − 1)(t_F + t_B) + 2c·[(S − 1) + (n − 2) − ⌊(n − 2)/S⌋].

    With c = 0 this is the GPipe bubble (proven as for GPipe). The message
    term is EMPIRICAL: it was read off the exact simulator (its coefficient of
    c does not depend on t_F, t_B or c) and then checked on 1,088 random
    configurations (S <= 8, n <= 64, t_F, t_B in [0.01, 5], c in [0, 10];
    worst relative error 5e-15) and by the tests; it is verified, not proven.
    Reading: the fill/drain pays 2(S − 1)c as in GPipe, and in steady state
    stage 0 keeps S items in flight, each a round trip of 2(S − 1) messages,
    i.e. 2c(1 − 1/S) per item — every item but one in S adds 2c.
    """
    return (n + S - 1) * (t_f + t_b) + 2 * c * ((S - 1) + (n - 2) - (n - 2) // S)


def _check_sizes(n_stages: int, n_items: int) -> None:
    if n_stages < 1:
        raise ScheduleError(f"n_stages must be >= 1, got {n_stages}")
    if n_items < 1:
        raise ScheduleError(f"n_items must be >= 1, got {n_items}")


# --------------------------------------------------------------------------
# the registry of schedules

Builder = Callable[[int, int], Schedule]
ClosedForm = Callable[..., float]


@dataclass(frozen=True)
class ScheduleEntry:
    """A schedule builder ``(n_stages, n_items) -> Schedule`` and what is known about it.

    closed_form(S, n, t_F, t_B, c) is the makespan under uniform costs when it
    is known (None otherwise); ``closed_form_note`` says how it was obtained
    ("proven" or "empirical: ..."), and ``slots(n, S)`` (the closed form with
    t_F = 1, t_B = 0, c = 0) is what the pipeline-time law fits against.
    """

    build: Builder
    closed_form: ClosedForm | None = None
    closed_form_note: str = ""
    law: str = ""  # the slots as text, e.g. "n*S" (for tables and verdicts)

    def slots(self, n: int, S: int) -> float | None:
        """Slots per direction under unit forward cost: n·S (sequential), n + S − 1 (fill-drain)."""
        return None if self.closed_form is None else self.closed_form(S, n, 1.0, 0.0, 0.0)


def _load_entry(obj: object, ref: str) -> ScheduleEntry:
    if isinstance(obj, ScheduleEntry):
        return obj
    if callable(obj):
        return ScheduleEntry(obj)
    raise RegistryError(
        f"schedule {ref!r} is neither a builder (n_stages, n_items) -> Schedule nor a ScheduleEntry"
    )


SCHEDULES: Registry[ScheduleEntry] = Registry("schedule", load=_load_entry)


def register_schedule(
    name: str,
    builder: Builder | None = None,
    *,
    closed_form: ClosedForm | None = None,
    closed_form_note: str = "",
    law: str = "",
    replace: bool = False,
):
    """Register a schedule builder under ``name`` (a decorator when ``builder`` is omitted).

    The builder takes (n_stages, n_items) and returns a ``Schedule``; it is
    then known to the engine, the simulator, the CLI and configuration files.
    """

    def add(b: Builder) -> Builder:
        entry = ScheduleEntry(b, closed_form, closed_form_note, law)
        SCHEDULES.register(name, entry, replace=replace)
        return b

    return add if builder is None else add(builder)


FILL_DRAIN_LAW = "K*m + S - 1"  # n = K·m items
register_schedule(
    "sequential", sequential, closed_form=sequential_time, closed_form_note="proven", law="n*S"
)
register_schedule(
    "gpipe", gpipe, closed_form=gpipe_time, closed_form_note="proven", law=FILL_DRAIN_LAW
)
register_schedule(
    "1f1b",
    one_f_one_b,
    closed_form=one_f_one_b_time,
    closed_form_note="empirical message term (verified on random configurations, not proven)",
    law=FILL_DRAIN_LAW,
)


def entry(name: str) -> ScheduleEntry:
    """The registry entry of ``name`` (built-in, registered, or package.module:builder)."""
    try:
        return SCHEDULES.get(name)
    except RegistryError as e:
        raise ScheduleError(str(e)) from None


def build(name: str, n_stages: int, n_items: int) -> Schedule:
    """Build the named schedule (see ``SCHEDULES``; ``package.module:builder`` works too)."""
    sch = entry(name).build(n_stages, n_items)
    if not isinstance(sch, Schedule):
        raise ScheduleError(f"schedule {name!r}: the builder returned {type(sch).__name__}")
    if (sch.n_stages, sch.n_items) != (n_stages, n_items):
        raise ScheduleError(
            f"schedule {name!r}: the builder made {sch.n_stages} stages x {sch.n_items} items "
            f"for {n_stages} x {n_items}"
        )
    return sch


# --------------------------------------------------------------------------
# the dependency walk: one loop for deadlock detection and for timing


def dependencies(a: Action, n_stages: int) -> tuple[Action, ...]:
    """Actions on *other* stages whose messages ``a`` waits for (see ``dependency``)."""
    return a.dependencies(n_stages)


def walk(
    schedule: Schedule,
    t_forward: Sequence[float] | None = None,
    t_backward: Sequence[float] | None = None,
    message: Sequence[Sequence[float]] | None = None,
    record: bool = False,
):
    """Run the schedule's dependency graph, timing it under a cost model.

    Every stage advances until its next action waits for a message that has
    not been produced (``dependency``); it is woken when that message's
    producer runs. With per-stage costs t_F[s], t_B[s] and per-(boundary,
    item) message costs c[s][i] (boundary s is between stages s and s+1), an
    action's times are exactly those of the engine on the model clock:

        ready = max(t_stage, end(dependency) + c),  end = ready + t_kind.

    Returns (stage_end_times, ends) where ends[s] lists each action's end
    time in list order; with ``record`` also (waits, readys). Raises
    ScheduleError naming the blocked actions when the stages wedge. Linear
    in the number of actions. This is the reference the simulator's
    vectorised paths are tested against.
    """
    S, n = schedule.n_stages, schedule.n_items
    cost = [[0.0] * S if t is None else [float(x) for x in t] for t in (t_forward, t_backward)]
    zero = [0.0] * n
    msg = [zero] * max(S - 1, 0) if message is None else [list(map(float, m)) for m in message]
    decoded = [decode_list(c) for c in schedule.codes]
    # end[k][s][i]: end of stage s's kind-k action on item i (None: not run yet)
    end = [[[None] * n for _ in range(S)] for _ in Kind]
    # waiting[k][s]: the item whose kind-k message stage s is blocked on (-1: none)
    waiting = [[-1] * S for _ in Kind]
    ends: list[list[float]] = [[] for _ in range(S)]
    waits: list[list[float]] = [[] for _ in range(S)]
    readys: list[list[float]] = [[] for _ in range(S)]
    pos = [0] * S
    clock = [0.0] * S
    ready_stack = list(range(S - 1, -1, -1))

    def per_kind(s: int, k: Kind):
        dep = dependency(s, k, S)
        dep_end = dep_msg = None
        if dep is not None:
            dep_end, dep_msg = end[dep[1]][dep[0]], msg[boundary(s, dep[0])]
        wake = consumer(s, k, S)
        return (dep_end, dep_msg, cost[k][s], end[k][s], -1 if wake is None else wake, waiting[k])

    # everything a stage's actions look up, built once: one tuple unpack per visit
    ctx = [
        (*decoded[s], len(decoded[s][0]), tuple(per_kind(s, k) for k in Kind), ends[s])
        for s in range(S)
    ]
    while ready_stack:
        s = ready_stack.pop()
        its, kds, L, kinds_ctx, out = ctx[s]
        ws, rs = waits[s], readys[s]
        p, t = pos[s], clock[s]
        while p < L:
            i = its[p]
            dep_end, dep_msg, t_k, own, wake, wait_k = kinds_ctx[kds[p]]
            w = t
            if dep_end is not None:
                e = dep_end[i]
                if e is None:
                    wait_k[s] = i
                    break
                e += dep_msg[i]
                if e > t:
                    t = e
            r = t
            t += t_k
            own[i] = t
            if wake >= 0 and wait_k[wake] == i:
                wait_k[wake] = -1
                ready_stack.append(wake)
            out.append(t)
            if record:
                ws.append(w)
                rs.append(r)
            p += 1
        pos[s], clock[s] = p, t
    if any(pos[s] < len(schedule.codes[s]) for s in range(S)):
        raise ScheduleError("schedule deadlocks: " + "; ".join(_blocked(schedule, pos)))
    if record:
        return clock, ends, waits, readys
    return clock, ends


def _blocked(schedule: Schedule, pos: Sequence[int]) -> list[str]:
    """'stage s waits at A for D' for every stage that did not finish its list."""
    out = []
    for s, codes in enumerate(schedule.codes):
        if pos[s] < len(codes):
            a = Action.of(s, int(codes[pos[s]]))
            deps = ", ".join(str(d) for d in a.dependencies(schedule.n_stages))
            out.append(f"stage {s} waits at {a} for {deps}")
    return out


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
    nc = n_codes(n)
    for s, codes in enumerate(schedule.codes):
        bad = np.flatnonzero((codes < 0) | (codes >= nc))
        if bad.size:
            a = Action.of(s, int(codes[bad[0]]))
            raise ScheduleError(f"action {a} names item {a.item}, outside 0..{n - 1}")
        counts = np.bincount(codes, minlength=nc)
        dup = np.flatnonzero(counts > 1)
        if dup.size:
            raise ScheduleError(f"action {Action.of(s, int(dup[0]))} appears twice on stage {s}")
        where = np.full(nc, -1, dtype=np.int64)
        where[codes] = np.arange(len(codes))
        i = _i(n)
        pf, pb = where[encode(i, Kind.FORWARD)], where[encode(i, Kind.BACKWARD)]
        early = np.flatnonzero((pb >= 0) & (pf >= 0) & (pb < pf))
        orphan = np.flatnonzero((pb >= 0) & (pf < 0))
        first = [int(x) for x in (early[:1].tolist() + orphan[:1].tolist())]
        if first:
            i = min(first, key=lambda x: pb[x])
            raise ScheduleError(f"action {s}B{i} comes before its forward {s}F{i} on stage {s}")
        missing = np.flatnonzero(counts == 0)
        if missing.size:
            raise ScheduleError(f"missing action {Action.of(s, int(missing[0]))} on stage {s}")
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
    return [
        int(np.max(np.cumsum(np.where(kinds(c) == Kind.FORWARD, 1, -1)), initial=0))
        for c in schedule.codes
    ]
