"""Pipeline schedules as data.

A schedule is, for each of S stages, the ordered list of actions that stage
executes for one oracle call over n work items: ``F(i)`` (forward of item i)
and ``B(i)`` (backward of item i). Actions print like torch.distributed
.pipelining's: ``2F0`` is stage 2, forward, item 0. The MPI engine executes a
schedule, the simulator times it and the visualiser draws it; none of them
contains schedule logic of its own.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

FORWARD = "F"
BACKWARD = "B"


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

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``'2F0'`` into ``Action(2, 'F', 0)``."""
        m = re.fullmatch(r"\s*(\d+)([FB])(\d+)\s*", text)
        if m is None:
            raise ScheduleError(f"cannot parse action {text!r}: expected e.g. '2F0' or '1B3'")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass(frozen=True)
class Schedule:
    """Per-stage ordered action lists for ``n_stages`` stages and ``n_items`` items."""

    name: str
    n_stages: int
    n_items: int
    actions: tuple[tuple[Action, ...], ...]

    @classmethod
    def from_lists(
        cls, name: str, n_items: int, lists: Sequence[Sequence[Action | str]]
    ) -> Schedule:
        """Build a schedule from per-stage lists of actions or action strings."""
        acts = tuple(
            tuple(a if isinstance(a, Action) else Action.parse(a) for a in stage_list)
            for stage_list in lists
        )
        return cls(name, len(acts), n_items, acts)

    def __len__(self) -> int:
        return sum(len(a) for a in self.actions)

    def validate(self) -> Schedule:
        """Raise ScheduleError naming the bad action; return self when valid."""
        validate(self)
        return self

    def render(self, actions_per_line: int | None = None) -> str:
        return render(self, actions_per_line)


# --------------------------------------------------------------------------
# builders


def sequential(n_stages: int, n_items: int) -> Schedule:
    """No overlap: item i goes forward through all stages and back before i+1.

    This is the naive pipelining of GD/AGD in the paper: every item pays the
    whole depth. Each stage runs F0 B0 F1 B1 ...; the dependencies serialise
    the items.
    """
    _check_sizes(n_stages, n_items)
    lists = [
        [a for i in range(n_items) for a in (Action(s, FORWARD, i), Action(s, BACKWARD, i))]
        for s in range(n_stages)
    ]
    return Schedule("sequential", n_stages, n_items, tuple(tuple(x) for x in lists))


def gpipe(n_stages: int, n_items: int) -> Schedule:
    """Fill-drain (the paper's "bubbling"): all forwards, then all backwards."""
    _check_sizes(n_stages, n_items)
    lists = [
        [Action(s, FORWARD, i) for i in range(n_items)]
        + [Action(s, BACKWARD, i) for i in range(n_items)]
        for s in range(n_stages)
    ]
    return Schedule("gpipe", n_stages, n_items, tuple(tuple(x) for x in lists))


def one_f_one_b(n_stages: int, n_items: int) -> Schedule:
    """1F1B: stage s runs min(n, S-s-1) warm-up forwards, then alternates F/B.

    At most S - s items are in flight (forwarded, not yet backwarded) on
    stage s, so at most S on any stage: activation memory is bounded by the
    depth instead of by n as in GPipe.
    """
    _check_sizes(n_stages, n_items)
    lists = []
    for s in range(n_stages):
        warm = min(n_items, n_stages - s - 1)
        acts = [Action(s, FORWARD, i) for i in range(warm)]
        nf, nb = warm, 0
        while nb < n_items:
            if nf < n_items:
                acts.append(Action(s, FORWARD, nf))
                nf += 1
            acts.append(Action(s, BACKWARD, nb))
            nb += 1
        lists.append(tuple(acts))
    return Schedule("1f1b", n_stages, n_items, tuple(lists))


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
# dependency order, validation and rendering


def dependencies(a: Action, n_stages: int) -> tuple[Action, ...]:
    """Actions on *other* stages whose messages ``a`` waits for."""
    if a.kind == FORWARD:
        return (Action(a.stage - 1, FORWARD, a.item),) if a.stage > 0 else ()
    return (Action(a.stage + 1, BACKWARD, a.item),) if a.stage < n_stages - 1 else ()


def execution_order(schedule: Schedule) -> list[Action]:
    """A global order in which every action's inputs are ready (a topological order).

    Each stage advances until its next action waits for a message that has
    not been produced; that stage is woken when the message's producer runs.
    Linear in the number of actions. Raises ScheduleError naming the blocked
    actions if the stages wedge (deadlock).
    """
    S = schedule.n_stages
    pos = [0] * S
    done: set[Action] = set()
    waiter: dict[Action, int] = {}
    order: list[Action] = []
    ready = list(range(S))
    while ready:
        s = ready.pop()
        lst = schedule.actions[s]
        while pos[s] < len(lst):
            a = lst[pos[s]]
            missing = [d for d in dependencies(a, S) if d not in done]
            if missing:
                waiter[missing[0]] = s
                break
            done.add(a)
            order.append(a)
            pos[s] += 1
            if a in waiter:
                ready.append(waiter.pop(a))
    if len(order) < len(schedule):
        blocked = [
            f"stage {s} waits at {schedule.actions[s][pos[s]]} for "
            + ", ".join(str(d) for d in dependencies(schedule.actions[s][pos[s]], S))
            for s in range(S)
            if pos[s] < len(schedule.actions[s])
        ]
        raise ScheduleError("schedule deadlocks: " + "; ".join(blocked))
    return order


def validate(schedule: Schedule) -> None:
    """Check completeness, same-stage order (F before B) and freedom from deadlock."""
    S, n = schedule.n_stages, schedule.n_items
    if S < 1 or n < 1:
        raise ScheduleError(f"schedule needs >= 1 stage and item, got {S} stages, {n} items")
    if len(schedule.actions) != S:
        raise ScheduleError(f"schedule has {len(schedule.actions)} stage lists for {S} stages")
    for s, lst in enumerate(schedule.actions):
        seen: set[Action] = set()
        for a in lst:
            if a.stage != s:
                raise ScheduleError(f"action {a} is in the list of stage {s}")
            if a.kind not in (FORWARD, BACKWARD):
                raise ScheduleError(f"action {a} has kind {a.kind!r}, not F or B")
            if not 0 <= a.item < n:
                raise ScheduleError(f"action {a} names item {a.item}, outside 0..{n - 1}")
            if a in seen:
                raise ScheduleError(f"action {a} appears twice on stage {s}")
            if a.kind == BACKWARD and Action(s, FORWARD, a.item) not in seen:
                raise ScheduleError(
                    f"action {a} comes before its forward {Action(s, FORWARD, a.item)} on stage {s}"
                )
            seen.add(a)
        for i in range(n):
            for kind in (FORWARD, BACKWARD):
                if Action(s, kind, i) not in seen:
                    raise ScheduleError(f"missing action {Action(s, kind, i)} on stage {s}")
    execution_order(schedule)


def render(schedule: Schedule, actions_per_line: int | None = None) -> str:
    """The per-stage action table, one row per stage, like torch's pipeline printer."""
    width = max((len(str(a)) for lst in schedule.actions for a in lst), default=3)
    rows = [
        f"{schedule.name}: {schedule.n_stages} stages, {schedule.n_items} items, "
        f"{len(schedule)} actions"
    ]
    for s, lst in enumerate(schedule.actions):
        cells = [str(a).rjust(width) for a in lst]
        if actions_per_line:
            cells = cells[:actions_per_line] + (["..."] if len(cells) > actions_per_line else [])
        rows.append(f"stage {s:>3} | " + " ".join(cells))
    return "\n".join(rows)


def max_in_flight(schedule: Schedule) -> list[int]:
    """Largest number of items forwarded but not yet backwarded, per stage."""
    out = []
    for lst in schedule.actions:
        cur = peak = 0
        for a in lst:
            cur += 1 if a.kind == FORWARD else -1
            peak = max(peak, cur)
        out.append(peak)
    return out


def names() -> Iterable[str]:
    return BUILDERS.keys()
