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
    """What an action does to its item. Its value is the low part of an action code.

    B is the whole backward; I (input gradient) and W (weight gradient) are
    its two halves (Qi et al., "Zero Bubble Pipeline Parallelism", 2023):
    I computes dL/dx and sends it on exactly as B does, W computes dL/dθ later.
    """

    FORWARD = 0
    BACKWARD = 1
    INPUT = 2
    WEIGHT = 3

    @property
    def letter(self) -> str:
        return "FBIW"[self]

    @classmethod
    def parse(cls, letter: str) -> Kind:
        return cls("FBIW".index(letter))


FORWARD, BACKWARD = Kind.FORWARD.letter, Kind.BACKWARD.letter
INPUT, WEIGHT = Kind.INPUT.letter, Kind.WEIGHT.letter
N_KINDS = len(Kind)
# kinds that send a message on (the gradient goes on from B or from I) and free the stash
GRADIENT_KINDS = (Kind.BACKWARD, Kind.INPUT)

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


def place(stages, codes, n_items: int):
    """Placed codes of (stage, code) pairs, the entries of a rank's list: stage·n_codes + code."""
    return n_codes(n_items) * stages + codes


def stages_of(placed, n_items: int):
    """The stage of each placed code."""
    return placed // n_codes(n_items)


def codes_of(placed, n_items: int):
    """The action code (item, kind) of each placed code."""
    return placed % n_codes(n_items)


def keys_of(placed, n_items: int):
    """stage·n_items + item of each placed code (its kind is ``kinds(placed)``).

    A placed code is N_KINDS·(stage·n_items + item) + kind, so one division
    gives the (stage, item) cell of a per-kind (S, n) table.
    """
    return placed // N_KINDS


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

# kind -> (stage offset of the producer, the message waited for: the kind that sends it);
# None: the action waits for no message. B and I both send the gradient, so a
# gradient dependency "(s+1, B)" is met by whichever of B(i) or I(i) stage s+1 runs.
DEPENDENCY: dict[Kind, tuple[int, Kind] | None] = {
    Kind.FORWARD: (-1, Kind.FORWARD),
    Kind.BACKWARD: (+1, Kind.BACKWARD),
    Kind.INPUT: (+1, Kind.BACKWARD),
    Kind.WEIGHT: None,
}
# kind -> the kind that must come earlier in the same stage's list for the same item
LOCAL: dict[Kind, Kind | None] = {
    Kind.FORWARD: None,
    Kind.BACKWARD: Kind.FORWARD,  # the stashed input
    Kind.INPUT: Kind.FORWARD,
    Kind.WEIGHT: Kind.INPUT,  # the output gradient I received (and the stashed input)
}


def message_of(kind: int) -> Kind | None:
    """The message an action of ``kind`` sends on: the activation (F), the gradient (B, I)."""
    k = Kind(kind)
    return None if k == Kind.WEIGHT else (Kind.FORWARD if k == Kind.FORWARD else Kind.BACKWARD)


def dependency(stage: int, kind: int, n_stages: int) -> tuple[int, Kind] | None:
    """(stage, message) of the action on another stage whose message this action waits for.

    The item is the same. ``sF(i)`` waits for the activation of ``(s-1)F(i)``,
    ``sB(i)`` and ``sI(i)`` for the gradient of ``(s+1)B(i)`` or ``(s+1)I(i)``
    (the message is named by its kind B); the first stage's forwards, the last
    stage's backwards and every W wait for nothing (None). On its own rank, an
    action also waits for the previous action of the rank's list, and ``LOCAL``
    names the action that must precede it on its own stage (checked by
    ``validate``). The stages may be on one rank: the hand-off is then a local
    copy and costs no message (``walk``).
    """
    dep = DEPENDENCY[Kind(kind)]
    if dep is None:
        return None
    s = stage + dep[0]
    return (s, dep[1]) if 0 <= s < n_stages else None


def consumer(stage: int, kind: int, n_stages: int) -> int | None:
    """The stage whose action waits for this action's message (None: no message or no stage)."""
    dep = DEPENDENCY[Kind(kind)]
    if dep is None or Kind(kind) == Kind.WEIGHT:
        return None
    s = stage - dep[0]
    return s if 0 <= s < n_stages else None


def boundary(stage: int, other: int) -> int:
    """Index of the link between neighbouring stages (link s joins stages s and s+1)."""
    return min(stage, other)


class ScheduleError(ValueError):
    """A schedule that is incomplete, out of dependency order, or deadlocks."""


@dataclass(frozen=True, slots=True)
class Action:
    """One action: stage ``stage`` runs the F, B, I or W of ``item``."""

    stage: int
    kind: str  # a Kind's letter
    item: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.item}"

    @property
    def code(self) -> int:
        return int(encode(self.item, Kind.parse(self.kind)))

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse ``'2F0'`` into ``Action(2, 'F', 0)``."""
        m = re.fullmatch(r"\s*(\d+)([FBIW])(\d+)\s*", text)
        if m is None:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected e.g. '2F0', '1B3', '1I3' or '1W3'"
            )
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
    """Ordered action codes for ``n_stages`` stages and ``n_items`` items, placed on ranks.

    ``placement[s]`` is the rank that owns stage s (default: stage s on rank
    s). ``order[r]`` is rank r's list as placed codes (``place``): the order in
    which the rank runs its actions, like torch's ``pipeline_order``.
    ``codes[s]`` is stage s's own list (its actions in the rank's order); with
    one stage per rank the two say the same thing and only ``codes`` is stored.
    """

    def __init__(
        self,
        name: str,
        n_stages: int,
        n_items: int,
        codes: Sequence[np.ndarray] | None,
        shape: str = "",
        placement: Sequence[int] | None = None,
        order: Sequence[np.ndarray] | None = None,
    ):
        self.name, self.n_stages, self.n_items = name, n_stages, n_items
        self.placement = (
            tuple(range(n_stages)) if placement is None else tuple(int(r) for r in placement)
        )
        self._order = None if order is None else tuple(np.asarray(o, np.int64) for o in order)
        if codes is None:
            if self._order is None:
                raise ScheduleError("a schedule needs its stage lists or its rank lists")
            flat = np.concatenate(self._order) if self._order else np.zeros(0, np.int64)
            st = stages_of(flat, n_items)
            by_stage = codes_of(flat[np.argsort(st, kind="stable")], n_items)  # keeps rank order
            cuts = np.cumsum(np.bincount(st, minlength=n_stages))[:-1] if len(st) else []
            codes = np.split(by_stage, cuts) if len(st) else [by_stage] * n_stages
        self.codes = tuple(np.asarray(c, dtype=np.int64) for c in codes)
        self.wrong_stage: list[tuple[int, Action]] = []
        # the built-in builder that made these lists ("" otherwise): the simulator
        # then tries that builder's kernel, after checking the lists are still its own
        # (``builders_lists``)
        self.shape = shape
        self._built: tuple[np.ndarray, ...] | None = None

    def _sealed(self) -> Schedule:
        """Mark the lists as the builder's own (built-in builders only): read-only, and
        remembered, so that ``builders_lists`` can tell they are unchanged."""
        for c in self.codes:
            c.setflags(write=False)
        self._built = self.codes
        return self

    @property
    def builders_lists(self) -> bool:
        """True while ``codes`` are still the (read-only) arrays the builder of ``shape``
        made: neither replaced nor made writable again. O(S), without reading the lists."""
        return (
            self._built is not None
            and self.codes is self._built
            and len(self.codes) == self.n_stages
            and not any(c.flags.writeable for c in self.codes)
        )

    @property
    def n_ranks(self) -> int:
        return max(self.placement, default=-1) + 1

    @property
    def one_stage_per_rank(self) -> bool:
        return self.placement == tuple(range(self.n_stages))

    @property
    def order(self) -> tuple[np.ndarray, ...]:
        """Per-rank placed codes (derived from ``codes`` when each rank owns one stage)."""
        if self._order is not None:
            return self._order
        if self.one_stage_per_rank:
            return tuple(place(s, c, self.n_items) for s, c in enumerate(self.codes))
        # stages placed but no order given: each rank runs its stages one after another
        out = [[] for _ in range(self.n_ranks)]
        for s, c in enumerate(self.codes):
            out[self.placement[s]].append(place(s, c, self.n_items))
        return tuple(np.concatenate(o) if o else np.zeros(0, np.int64) for o in out)

    @classmethod
    def from_lists(
        cls, name: str, n_items: int, lists: Sequence[Sequence[Action | str]]
    ) -> Schedule:
        """Build a schedule from per-stage lists of actions or action strings."""
        acts = [[a if isinstance(a, Action) else Action.parse(a) for a in lst] for lst in lists]
        sch = cls(name, len(acts), n_items, [[a.code for a in lst] for lst in acts])
        sch.wrong_stage = [(s, a) for s, lst in enumerate(acts) for a in lst if a.stage != s]
        return sch

    @classmethod
    def from_rank_lists(
        cls,
        name: str,
        n_items: int,
        lists: Sequence[Sequence[Action | str]],
        placement: Sequence[int] | None = None,
    ) -> Schedule:
        """Build a schedule from per-rank lists (torch's ``pipeline_order``).

        Without ``placement``, stage s is on the rank whose list holds it
        (stages absent from every list raise ScheduleError).
        """
        acts = [[a if isinstance(a, Action) else Action.parse(a) for a in lst] for lst in lists]
        if placement is None:
            owner: dict[int, int] = {}
            for r, lst in enumerate(acts):
                for a in lst:
                    if owner.setdefault(a.stage, r) != r:
                        raise ScheduleError(
                            f"action {a} is on rank {r} but stage {a.stage} is on rank "
                            f"{owner[a.stage]}: a stage runs on one rank"
                        )
            S = max(owner, default=-1) + 1
            missing = [s for s in range(S) if s not in owner]
            if missing:
                raise ScheduleError(f"stage {missing[0]} has no action on any rank")
            placement = [owner[s] for s in range(S)]
        placement = [int(r) for r in placement]
        S = len(placement)
        for r, lst in enumerate(acts):
            for a in lst:
                if not 0 <= a.stage < S:
                    raise ScheduleError(f"action {a} names stage {a.stage}, outside 0..{S - 1}")
                if placement[a.stage] != r:
                    raise ScheduleError(
                        f"action {a} is in the list of rank {r}; stage {a.stage} is on rank "
                        f"{placement[a.stage]}"
                    )
        for a in (a for lst in acts for a in lst):
            if a.item >= n_items:
                raise ScheduleError(f"action {a} names item {a.item}, outside 0..{n_items - 1}")
        order = [np.array([place(a.stage, a.code, n_items) for a in lst], np.int64) for lst in acts]
        order += [np.zeros(0, np.int64)] * (max(placement, default=-1) + 1 - len(order))
        return cls(name, S, n_items, None, placement=placement, order=order)

    @cached_property
    def actions(self) -> tuple[tuple[Action, ...], ...]:
        return tuple(tuple(Action.of(s, int(c)) for c in cs) for s, cs in enumerate(self.codes))

    @cached_property
    def rank_actions(self) -> tuple[tuple[Action, ...], ...]:
        """Each rank's list of actions, in its order."""
        n = self.n_items
        return tuple(
            tuple(Action.of(int(s), int(c)) for s, c in zip(stages_of(o, n), codes_of(o, n)))
            for o in self.order
        )

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
    codes = np.empty(2 * n_items, dtype=np.int64)
    codes[0::2] = encode(_i(n_items), Kind.FORWARD)
    codes[1::2] = encode(_i(n_items), Kind.BACKWARD)
    return Schedule("sequential", n_stages, n_items, [codes] * n_stages, "sequential")._sealed()


def gpipe(n_stages: int, n_items: int) -> Schedule:
    """Fill-drain (the paper's "bubbling"): all forwards, then all backwards."""
    _check_sizes(n_stages, n_items)
    i = _i(n_items)
    codes = np.concatenate([encode(i, Kind.FORWARD), encode(i, Kind.BACKWARD)])
    return Schedule("gpipe", n_stages, n_items, [codes] * n_stages, "gpipe")._sealed()


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
    return Schedule("1f1b", n_stages, n_items, lists, "1f1b")._sealed()


def _rank_schedule(
    name: str, n_items: int, placement: Sequence[int], lists: Sequence[list], shape: str
) -> Schedule:
    """A placed schedule from per-rank lists of (stage, kind, item) triples."""
    order = []
    for lst in lists:
        a = np.array(lst, dtype=np.int64).reshape(-1, 3)
        order.append(place(a[:, 0], encode(a[:, 2], a[:, 1]), n_items))
    return Schedule(name, len(placement), n_items, None, shape, placement, order)


def zb_h1(n_ranks: int, n_items: int) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §3.1, Fig. 3).

    1F1B with each B split into I and W, and the W's of stage s delayed by
    d = s: stage s runs w = min(n, P − 1 − s) warm-up forwards, then, for
    j = 0, 1, ...: F(w + j) while forwards remain, I(j), and W(j − d) once
    j >= d; then the W's left. Every stage keeps at most P items stashed (as
    1F1B's first stage does), and the I's, now shorter than a B, carry the
    gradient up while the W's fill the drain. The same lists as torch's
    ``ScheduleInterleavedZeroBubble`` with one stage per rank (tested).
    """
    _check_sizes(n_ranks, n_items)
    n = n_items
    j = _i(n)
    lists = []
    for s in range(n_ranks):
        w, d = min(n, n_ranks - 1 - s), s
        # step j: F(w + j) while forwards remain, I(j), W(j − d) once j >= d
        steps = np.full((n, 3), -1, dtype=np.int64)
        steps[:, 0] = np.where(w + j < n, encode(w + j, Kind.FORWARD), -1)
        steps[:, 1] = encode(j, Kind.INPUT)
        steps[:, 2] = np.where(j >= d, encode(j - d, Kind.WEIGHT), -1)
        flat = steps.ravel()
        nw = max(0, n - d)
        codes = np.concatenate(
            [encode(_i(w), Kind.FORWARD), flat[flat >= 0], encode(_i(n, nw), Kind.WEIGHT)]
        )
        lists.append(place(s, codes, n))
    return Schedule("zb-h1", n_ranks, n, None, "zb-h1", range(n_ranks), lists)


def interleaved_1f1b(n_ranks: int, n_items: int, virtual: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
    Training on GPU Clusters Using Megatron-LM", SC 2021, §2.2.2).

    S = vP stages, stage s on rank s mod P (looped placement). The items run in
    rounds of g = n / max(1, ⌊n/P⌋) (g = P when P divides n, as in the paper;
    any n < P is one round of g = n; other n need a whole number of rounds, as
    torch's relaxed rule). Rank r's k-th forward is of its local stage
    ⌊k/g⌋ mod v (stage lP + r) and item ⌊k/(gv)⌋g + k mod g; its k-th backward
    visits the local stages in reverse. It runs min(vn, (v − 1)g + 2(P − 1 − r))
    warm-up forwards, then alternates F and B, then the remaining B's. The same
    lists as torch's ``ScheduleInterleaved1F1B`` (tested where P divides n).
    """
    _check_sizes(n_ranks, n_items)
    P, n, v = n_ranks, n_items, int(virtual)
    if v < 1:
        raise ScheduleError(f"virtual stages per rank must be >= 1, got {v}")
    rounds = max(1, n // P)
    if n % rounds:
        raise ScheduleError(
            f"interleaved-1f1b runs items in rounds of about the rank count: n_items ({n}) "
            f"must be below the ranks ({P}) or a multiple of n_items // ranks ({rounds})"
        )
    g = n // rounds
    total = v * n
    k = _i(total)
    local, item = (k // g) % v, (k // (g * v)) * g + k % g
    lists = []
    for r in range(P):
        fw = place(local * P + r, encode(item, Kind.FORWARD), n)
        bw = place((v - 1 - local) * P + r, encode(item, Kind.BACKWARD), n)
        warm = min(total, (v - 1) * g + 2 * (P - 1 - r))
        mid = np.empty(2 * (total - warm), dtype=np.int64)
        mid[0::2], mid[1::2] = fw[warm:], bw[: total - warm]
        lists.append(np.concatenate([fw[:warm], mid, bw[total - warm :]]))
    placement = [s % P for s in range(v * P)]
    return Schedule("interleaved-1f1b", v * P, n, None, "interleaved-1f1b", placement, lists)


def looped_bfs(n_ranks: int, n_items: int, virtual: int = 2) -> Schedule:
    """Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", MLSys 2023).

    The looped placement of interleaved 1F1B (S = vP, stage s on rank s mod P)
    run breadth first: rank r forwards every item through its local stage 0,
    then 1, ..., then runs the backwards with the local stages and the items
    in reverse. The same lists as torch's ``ScheduleLoopedBFS`` (tested).
    """
    _check_sizes(n_ranks, n_items)
    P, n, v = n_ranks, n_items, int(virtual)
    if v < 1:
        raise ScheduleError(f"virtual stages per rank must be >= 1, got {v}")
    lo, i = np.divmod(_i(v * n), n)
    lists = []
    for r in range(P):
        fw = place(lo * P + r, encode(i, Kind.FORWARD), n)
        bw = place(lo[::-1] * P + r, encode(i[::-1], Kind.BACKWARD), n)
        lists.append(np.concatenate([fw, bw]))
    placement = [s % P for s in range(v * P)]
    return Schedule("looped-bfs", v * P, n, None, "looped-bfs", placement, lists)


def zb_v(n_ranks: int, n_items: int) -> Schedule:
    """ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6).

    V placement: S = 2P stages, rank r owns stages r and 2P − 1 − r, so the
    first and the last stage share rank 0 and the turn of the V (stages P − 1
    and P) is a local hand-off on rank P − 1. Rank r's list, for
    N = max(2P − 1, n) items (actions of items >= n are then dropped):
    2(P − r) − 1 forwards of its first stage; r pairs F(second), F(first);
    P − r triples F, I, W of its second stage; then, while forwards remain,
    F(first) I(first) W(first) F(second) I(second) W(second); then r pairs
    I(first), I(second); P − r pairs I(first), W(first); the W's left of the
    second stage, then of the first. The same lists as torch's
    ``ScheduleZBVZeroBubble`` (tested).
    """
    _check_sizes(n_ranks, n_items)
    P, n = n_ranks, n_items
    N = max(2 * P - 1, n)
    F, I, W = Kind.FORWARD, Kind.INPUT, Kind.WEIGHT
    lists = []
    for r in range(P):
        a, b = r, 2 * P - 1 - r

        def at(stage, kind, item):
            return place(stage, encode(np.asarray(item, dtype=np.int64), kind), N)

        warm0 = 2 * (P - r) - 1  # forwards of the first stage
        pairs = _i(r)  # then F(second, k), F(first, warm0 + k)
        triples = _i(P - r)  # then F, I, W of the second stage, items r + k
        m = N - P  # steady steps (the loop's count: f0 reaches N, then f1 catches up)
        j = _i(m)
        f0 = warm0 + r + j
        steady = np.stack(
            [
                np.where(f0 < N, at(a, F, np.minimum(f0, N - 1)), -1),
                at(a, I, j),
                at(a, W, j),
                at(b, F, P + j),
                at(b, I, P - r + j),
                at(b, W, P - r + j),
            ],
            axis=1,
        ).ravel()
        b0, b1 = m, P - r + m  # next I of each stage after the steady steps
        cool = np.stack([at(a, I, b0 + pairs), at(b, I, b1 + pairs)], axis=1).ravel()
        tail = _i(P - r)
        drain = np.stack([at(a, I, b0 + r + tail), at(a, W, m + tail)], axis=1).ravel()
        parts = [
            at(a, F, _i(warm0)),
            np.stack([at(b, F, pairs), at(a, F, warm0 + pairs)], axis=1).ravel(),
            np.stack([at(b, F, r + triples), at(b, I, triples), at(b, W, triples)], axis=1).ravel(),
            steady[steady >= 0],
            cool,
            drain,
            at(b, W, np.arange(P - r + m, b1 + r)),  # the second stage's W's left
            at(a, W, np.arange(m + P - r, b0 + P)),  # then the first stage's
        ]
        flat = np.concatenate(parts)
        keep = items(codes_of(flat, N)) < n  # items past n exist only to shape the lists
        st, c = stages_of(flat[keep], N), codes_of(flat[keep], N)
        lists.append(place(st, c, n))
    placement = [s if s < P else 2 * P - 1 - s for s in range(2 * P)]
    return Schedule("zb-v", 2 * P, n, None, "zb-v", placement, lists)


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


class OutsideRegime(ValueError):
    """A closed form asked about costs or sizes where it was not derived."""


def _split(t_b: float, t_i: float | None, t_w: float | None) -> tuple[float, float]:
    if t_i is None or t_w is None:
        ti, tw = split_backward(t_b)
        return float(ti), float(tw)
    return float(t_i), float(t_w)


def interleaved_1f1b_time(
    S: int, n: int, t_f: float, t_b: float, c: float = 0.0, *, virtual: int = 2, **_
) -> float:
    """T = (v·max(n, P) + min(n, P) − 1)(t_F + t_B) + 2(vP − 1)c·[P > 1], P = S ranks.

    For n a multiple of P this is (vn + P − 1)(t_F + t_B) with c = 0 (Narayanan et
    al. 2021, §2.2.2): each rank does vn(t_F + t_B) of work and waits only during the
    fill and the drain, (P − 1)(t_F + t_B) in all, i.e. the 1F1B bubble of a stage v
    times cheaper. For n < P (one round of n items) it is (vP + n − 1)(t_F + t_B),
    GPipe's on vP stages: an item is back on rank 0 for its next local stage only
    after P forwards, so the ranks wait for the items as a fill-drain pipeline of vP
    stages does. The n < P case, the other n the builder accepts (rounds of g ≠ P)
    and the message term are EMPIRICAL: read off the exact simulator and checked on
    random configurations by the tests (v <= 3, P <= 8, n < 30, t_F, t_B in
    [0.1, 2]; with c > 0 only for n < P or n a multiple of P, c <= min(t_F, t_B):
    with rounds of g ≠ P items the messages partly hide and the term is an upper
    bound, not claimed).
    """
    P, v = S, int(virtual)
    rounds = max(1, n // P)
    if n % rounds:
        raise OutsideRegime(f"interleaved-1f1b needs n ({n}) < P ({P}) or a multiple of n // P")
    if c > 0 and n > P and n % P:
        raise OutsideRegime("interleaved-1f1b's message term is checked for n < P or P | n")
    if c > min(t_f, t_b):
        raise OutsideRegime("interleaved-1f1b's message term is checked for c <= min(t_F, t_B)")
    bubble = v * max(n, P) + min(n, P) - 1
    return bubble * (t_f + t_b) + (2 * (v * P - 1) * c if P > 1 else 0.0)


def looped_bfs_time(
    S: int, n: int, t_f: float, t_b: float, c: float = 0.0, *, virtual: int = 2, **_
) -> float:
    """T = (vn + P − 1)(t_F + t_B) + 2(P − 1)c when n·min(t_F, t_B) >= P(max(t_F, t_B) + c);
    T = (n + vP − 1)(t_F + t_B) + 2(vP − 1)c·[P > 1] when n <= P.

    Proof (n·min >= P(max + c)): item 0 comes back to rank 0 for its next loop
    after P actions and P hops, P(t_F + c), while rank 0 is still busy with the
    n items of its current loop (the condition), so no rank waits between
    loops. The last rank starts at (P − 1)(t_F + c) (the fill), then runs its
    vn forwards and vn backwards without a gap (each of its inputs is ready
    first, by the same argument), and the gradients take (P − 1)(t_B + c) to
    drain to rank 0.

    Proof (n <= P): rank r ends its loop on stage r by (r + n)t_F + r·c, no
    later than item 0 reaches stage r + P on the same rank, (r + P)(t_F + c):
    no rank ever holds an item back for its own earlier loop, so the items
    flow as through GPipe on vP stages, one hop between any two consecutive
    stages (a hop to the same rank only when P = 1, which is free):
    (n + vP − 1)(t_F + t_B) plus 2(vP − 1) messages. Checked against the exact
    simulator on random costs by the tests. Between the two regimes the ranks
    wait for one another in a pattern that depends on the costs; no closed form
    is claimed there.
    """
    P, v = S, int(virtual)
    if n <= P:
        return (n + v * P - 1) * (t_f + t_b) + (2 * (v * P - 1) * c if P > 1 else 0.0)
    if n * min(t_f, t_b) < P * (max(t_f, t_b) + c):
        raise OutsideRegime("looped-bfs's closed form needs n·min(t_F, t_B) >= P(max + c)")
    return (v * n + P - 1) * (t_f + t_b) + 2 * (P - 1) * c


def zb_h1_time(
    S: int,
    n: int,
    t_f: float,
    t_b: float,
    c: float = 0.0,
    *,
    t_i: float | None = None,
    t_w: float | None = None,
    **_,
) -> float:
    """T = n(t_F + t_I + t_W) + (P − 1)(t_F + t_I − t_W), for n >= P, t_W <= min(t_F, t_I), c = 0;
    T = (n + P − 1)(t_F + t_I) + t_W for n <= P (same conditions): both give
    (2P − 1)(t_F + t_I) + t_W at n = P.

    Qi et al. (2023, §3.1) give ZB-H1's bubble as (p − 1)(T_F + T_B − T_W),
    where their T_B is the backward for the input, our t_I (their full
    backward is T_B + T_W): in our notation (P − 1)(t_F + t_I − t_W), not
    (P − 1)(t_F + t_B − t_W). Reading: 1F1B's bubble (P − 1)(t_F + t_I + t_W)
    loses 2(P − 1)t_W, since the gradient travels up through I's only and
    each stage's delayed W's (s of them on stage s) fill its drain. EMPIRICAL
    on our lists: checked against the exact simulator on random
    configurations (P <= 6, n <= 16, costs in [0.1, 2]) by the tests, and
    it fails outside the stated regime (e.g. t_W > t_I), where the formula
    is not claimed. No message term is claimed (c must be 0).

    With n <= P items (GD's single item on a deep pipeline) no stage ever has
    a W ready in the fill and the drain's I's are back to back: the path is
    item 0's forward, the later items' forwards and I's on the way, n + P − 1
    slots of t_F + t_I on it, and only stage 0's last W is left after the
    last I. EMPIRICAL as well: the same tests check it (n <= P, random costs
    in the regime).
    """
    P = S
    ti, tw = _split(t_b, t_i, t_w)
    if c != 0.0 or tw > min(t_f, ti):
        raise OutsideRegime("zb-h1's closed form holds for c = 0, t_W <= min(t_F, t_I)")
    if n <= P:
        return (n + P - 1) * (t_f + ti) + tw
    return n * (t_f + ti + tw) + (P - 1) * (t_f + ti - tw)


def zb_v_time(
    S: int,
    n: int,
    t_f: float,
    t_b: float,
    c: float = 0.0,
    *,
    t_i: float | None = None,
    t_w: float | None = None,
    **_,
) -> float:
    """T = (6n + P − 1)t for t_F = t_I = t_W = t, n >= 2P − 1, c = 0;
    T = (4n + 4P − 2)t for n <= P (same costs).

    Each rank runs 2n(t_F + t_I + t_W) = 6nt of work; the makespan exceeds it
    by (P − 1)t, the time item 0 needs to reach the last rank (Qi et al.,
    2023, §6, call ZB-V bubble-free in this regime up to that fill). EMPIRICAL
    on torch's ZB-V lists (ours are the same): read off and checked against
    the exact simulator by the tests; with unequal costs the makespan is
    piecewise and no closed form is claimed.

    With n <= P items (GD's single item, or K <= P on a deep pipeline): one
    item's path is its 2P forwards, its 2P I's and two W's, the last rank's W
    of stage P (its list runs it before the I of stage P − 1, where the path
    turns) and stage 0's W at the end, (4P + 2)t; each further item adds 4t.
    EMPIRICAL: read off the simulator's end times and checked against it by
    the tests. For P < n < 2P − 1 the makespan moves from one form to the
    other in a way no formula here claims.
    """
    ti, tw = _split(t_b, t_i, t_w)
    if c != 0.0 or not (t_f == ti == tw):
        raise OutsideRegime("zb-v's closed form holds for c = 0, t_F = t_I = t_W")
    if n <= S:
        return (4 * n + 4 * S - 2) * t_f
    if n < 2 * S - 1:
        raise OutsideRegime("zb-v's closed form holds for n <= P or n >= 2P - 1")
    return (6 * n + S - 1) * t_f


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
        if self.closed_form is None:
            return None
        try:
            return self.closed_form(S, n, 1.0, 0.0, 0.0)
        except OutsideRegime:
            return None


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


register_schedule(
    "interleaved-1f1b",
    interleaved_1f1b,
    closed_form=interleaved_1f1b_time,
    closed_form_note="proven with c = 0 and P | n; empirical otherwise and for the message "
    "term (random configurations)",
    law="v*max(n, S) + min(n, S) - 1",
)
register_schedule(
    "looped-bfs",
    looped_bfs,
    closed_form=looped_bfs_time,
    closed_form_note="proven for n <= P and for n·min(t_F, t_B) >= P(max(t_F, t_B) + c)",
    law="n + v*S - 1 (n <= S)",
)
register_schedule(
    "zb-h1",
    zb_h1,
    closed_form=zb_h1_time,
    closed_form_note="empirical (random configurations): c = 0, t_W <= min(t_F, t_I)",
    law="n + S - 1",
)
register_schedule(
    "zb-v",
    zb_v,
    closed_form=zb_v_time,
    closed_form_note="empirical: c = 0, n <= P or n >= 2P - 1, t_F = t_I = t_W",
)


def builtin_names() -> list[str]:
    """The schedules this module registers (not those a user or a test adds), in order."""
    return [n for n in SCHEDULES.names() if SCHEDULES.get(n).build.__module__ == __name__]


def entry(name: str) -> ScheduleEntry:
    """The registry entry of ``name`` (built-in, registered, or package.module:builder)."""
    try:
        return SCHEDULES.get(name)
    except RegistryError as e:
        raise ScheduleError(str(e)) from None


def build(name: str, n_stages: int, n_items: int, **options) -> Schedule:
    """Build the named schedule (see ``SCHEDULES``; ``package.module:builder`` works too).

    ``n_stages`` is the number of ranks (equal to the stages when each rank
    owns one); ``options`` (e.g. ``virtual=2``) go to builders that take them.
    """
    sch = entry(name).build(n_stages, n_items, **options)
    if not isinstance(sch, Schedule):
        raise ScheduleError(f"schedule {name!r}: the builder returned {type(sch).__name__}")
    if (sch.n_ranks, sch.n_items) != (n_stages, n_items):
        raise ScheduleError(
            f"schedule {name!r}: the builder made {sch.n_ranks} ranks x {sch.n_items} items "
            f"for {n_stages} x {n_items}"
        )
    return sch


# --------------------------------------------------------------------------
# the dependency walk: one loop for deadlock detection and for timing


def dependencies(a: Action, n_stages: int) -> tuple[Action, ...]:
    """Actions on *other* stages whose messages ``a`` waits for (see ``dependency``)."""
    return a.dependencies(n_stages)


def split_backward(t_backward, weight_share: float = 0.5):
    """(t_I, t_W) of a backward of cost t_B: t_W = share·t_B, t_I = t_B − t_W.

    For a dense layer y = act(xW + b) both halves are one matrix product of the
    same size (dL/dx = δWᵀ, dL/dW = xᵀδ), hence the default share 1/2.
    """
    tb = np.asarray(t_backward, dtype=np.float64)
    tw = tb * weight_share
    return tb - tw, tw


def local_hops(schedule: Schedule) -> np.ndarray:
    """(S − 1,) bool: True where stages s and s + 1 are on the same rank (a local copy)."""
    p = np.asarray(schedule.placement, dtype=np.int64)
    return p[:-1] == p[1:]


def walk(
    schedule: Schedule,
    t_forward: Sequence[float] | None = None,
    t_backward: Sequence[float] | None = None,
    message: Sequence[Sequence[float]] | None = None,
    record: bool = False,
    t_input: Sequence[float] | None = None,
    t_weight: Sequence[float] | None = None,
):
    """Run the schedule's dependency graph, timing it under a cost model.

    Every rank advances along its list until its next action waits for a
    message that has not been produced (``dependency``); it is woken when that
    message's producer runs. With per-stage costs t_F[s], t_B[s], t_I[s],
    t_W[s] and per-(boundary, item) message costs c[s][i] (boundary s is
    between stages s and s+1), an action's times are exactly those of the
    engine on the model clock:

        ready = max(t_rank, end(dependency) + c),  end = ready + t_kind,

    where c = 0 when both stages are on one rank (the hand-off is a local
    copy, not a message: no α, no β). Without t_I, t_W the backward splits as
    ``split_backward``.

    Returns (rank_end_times, ends) where ends[r] lists each action's end time
    in rank r's order (with one stage per rank, rank r is stage r); with
    ``record`` also (waits, readys). Raises ScheduleError naming the wait-for
    cycle when the ranks wedge. Linear in the number of actions. This is the
    reference the simulator's vectorised paths are tested against.
    """
    S, n, R = schedule.n_stages, schedule.n_items, schedule.n_ranks
    tf = [0.0] * S if t_forward is None else [float(x) for x in t_forward]
    tb = [0.0] * S if t_backward is None else [float(x) for x in t_backward]
    if t_input is None or t_weight is None:
        ti, tw = (x.tolist() for x in split_backward(tb))
    else:
        ti, tw = [float(x) for x in t_input], [float(x) for x in t_weight]
    cost = (tf, tb, ti, tw)
    zero = [0.0] * n
    msg = [zero] * max(S - 1, 0) if message is None else [list(map(float, m)) for m in message]
    local = local_hops(schedule).tolist()
    msg = [zero if local[b] else m for b, m in enumerate(msg)]
    placement = schedule.placement
    # end[k][s][i]: end of stage s's kind-k action on item i (None: not run yet);
    # sent[k][s][i]: end of the action that sent stage s's kind-k message (F; B or I)
    end = [[[None] * n for _ in range(S)] for _ in Kind]
    sent = {Kind.FORWARD: end[Kind.FORWARD], Kind.BACKWARD: end[Kind.BACKWARD]}
    # waiting[k][s]: the item whose kind-k message stage s's rank is blocked on (-1: none)
    waiting = {k: [-1] * S for k in sent}
    pos = [0] * R
    clock = [0.0] * R
    ends: list[list[float]] = [[] for _ in range(R)]
    waits: list[list[float]] = [[] for _ in range(R)]
    readys: list[list[float]] = [[] for _ in range(R)]
    ready_stack = list(range(R - 1, -1, -1))

    def per_kind(s: int, k: Kind):
        dep = dependency(s, k, S)
        dep_end = dep_msg = wait_k = None
        if dep is not None:
            dep_end, wait_k = sent[dep[1]][dep[0]], waiting[dep[1]]
            dep_msg = msg[boundary(s, dep[0])]
        m = message_of(k)
        wake = consumer(s, k, S)
        fwd = None if m is None else sent[m][s]  # an I also fills the gradient table
        extra = fwd if (m is not None and m != k) else None
        wake_wait = None if (m is None or wake is None) else waiting[m]
        wake_rank = -1 if wake is None else placement[wake]
        return (dep_end, dep_msg, cost[k][s], end[k][s], extra, wake, wake_rank, wake_wait, wait_k)

    table = [[per_kind(s, k) for k in Kind] for s in range(S)]
    decoded = []
    for o in schedule.order:
        st = stages_of(o, n)
        c = codes_of(o, n)
        decoded.append((st.tolist(), items(c).tolist(), kinds(c).tolist(), len(o)))
    while ready_stack:
        r = ready_stack.pop()
        sts, its, kds, L = decoded[r]
        out, ws, rs = ends[r], waits[r], readys[r]
        p, t = pos[r], clock[r]
        while p < L:
            s, i = sts[p], its[p]
            dep_end, dep_msg, t_k, own, extra, wake, wake_rank, wake_wait, wait_k = table[s][kds[p]]
            w = t
            if dep_end is not None:
                e = dep_end[i]
                if e is None:
                    wait_k[s] = i
                    break
                e += dep_msg[i]
                if e > t:
                    t = e
            rd = t
            t += t_k
            own[i] = t
            if extra is not None:
                extra[i] = t
            if wake_wait is not None and wake_wait[wake] == i:
                wake_wait[wake] = -1
                if wake_rank != r:
                    ready_stack.append(wake_rank)
            out.append(t)
            if record:
                ws.append(w)
                rs.append(rd)
            p += 1
        pos[r], clock[r] = p, t
    if any(pos[r] < len(o) for r, o in enumerate(schedule.order)):
        raise ScheduleError(deadlock_report(schedule, pos))
    if record:
        return clock, ends, waits, readys
    return clock, ends


def _producer(schedule: Schedule, stage: int, message: Kind, item: int) -> Action:
    """The action of ``stage`` that sends ``message`` (F; the gradient: B or I) of ``item``."""
    if message == Kind.BACKWARD:
        codes = schedule.codes[stage]
        if np.any(codes == encode(item, Kind.INPUT)):
            return Action(stage, INPUT, item)
    return Action(stage, message.letter, item)


def deadlock_report(schedule: Schedule, pos: Sequence[int]) -> str:
    """Why the ranks wedge: each blocked rank's action, the cycle of waits, the marked grid.

    Rank r blocked at action a waits for the rank that owns a's producer; that
    rank is blocked too (else it would have produced it), so following the
    waits from any blocked rank closes a cycle, which is named.
    """
    n, S = schedule.n_items, schedule.n_stages
    blocked: dict[int, tuple[Action, Action | None]] = {}
    for r, o in enumerate(schedule.order):
        if pos[r] < len(o):
            a = Action.of(int(stages_of(o[pos[r]], n)), int(codes_of(o[pos[r]], n)))
            dep = dependency(a.stage, Kind.parse(a.kind), S)
            blocked[r] = (a, None if dep is None else _producer(schedule, dep[0], dep[1], a.item))
    parts = [f"rank {r} waits at {a} for {d}" for r, (a, d) in blocked.items()]
    cycle: list[int] = []
    r = next(iter(blocked))
    while r not in cycle and r in blocked and blocked[r][1] is not None:
        cycle.append(r)
        r = schedule.placement[blocked[r][1].stage]
    if r in cycle:
        ring = cycle[cycle.index(r) :] + [r]
        names = " -> ".join(f"{blocked[x][0]}" for x in ring)
        parts.append(f"cycle: {names}")
    mark = {r: pos[r] for r in blocked}
    # keep the historical per-stage wording for one-stage-per-rank schedules
    text = "; ".join(parts)
    if schedule.one_stage_per_rank:
        text = text.replace("rank ", "stage ")
    return "schedule deadlocks: " + text + "\n" + grid(schedule, mark=mark)


def execution_order(schedule: Schedule) -> list[Action]:
    """A global order in which every action's inputs are ready (a topological order).

    Under unit costs and no messages, sorting all actions by end time (ties by
    rank) respects every dependency, since a dependency ends strictly earlier.
    """
    S = schedule.n_stages
    _, ends = walk(schedule, [1.0] * S, [1.0] * S, t_input=[1.0] * S, t_weight=[1.0] * S)
    R = len(ends)
    acts = [(ends[r][p], r, p) for r in range(R) for p in range(len(ends[r]))]
    acts.sort()
    return [schedule.rank_actions[r][p] for _, r, p in acts]


def validate(schedule: Schedule) -> None:
    """Check placement, completeness, same-stage order (``LOCAL``) and freedom from deadlock.

    Each item runs on each stage its F and either B or both I and W; B and I
    come after the F, W after the I; each rank runs only its own stages.
    """
    S, n = schedule.n_stages, schedule.n_items
    if S < 1 or n < 1:
        raise ScheduleError(f"schedule needs >= 1 stage and item, got {S} stages, {n} items")
    if len(schedule.codes) != S:
        raise ScheduleError(f"schedule has {len(schedule.codes)} stage lists for {S} stages")
    if len(schedule.placement) != S:
        raise ScheduleError(f"placement names {len(schedule.placement)} stages for {S}")
    if schedule.wrong_stage:
        s, a = schedule.wrong_stage[0]
        raise ScheduleError(f"action {a} is in the list of stage {s}")
    R = schedule.n_ranks
    idle = sorted(set(range(R)) - set(schedule.placement))
    if min(schedule.placement) < 0 or idle:
        raise ScheduleError(f"placement leaves rank {idle[0] if idle else -1} without a stage")
    nc = n_codes(n)
    i = _i(n)
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
        at = {k: where[encode(i, k)] for k in Kind}
        for k, before in LOCAL.items():
            if before is None:
                continue
            pk, pb = at[k], at[before]
            early = np.flatnonzero((pk >= 0) & (pb >= 0) & (pk < pb))
            orphan = np.flatnonzero((pk >= 0) & (pb < 0))
            first = [int(x) for x in (early[:1].tolist() + orphan[:1].tolist())]
            if first:
                j = min(first, key=lambda x: pk[x])
                what = "forward" if before == Kind.FORWARD else "input gradient"
                raise ScheduleError(
                    f"action {s}{k.letter}{j} comes before its {what} {s}{before.letter}{j} "
                    f"on stage {s}"
                )
        both = np.flatnonzero((at[Kind.BACKWARD] >= 0) & (at[Kind.INPUT] >= 0))
        if both.size:
            j = int(both[0])
            raise ScheduleError(
                f"stage {s} runs both {s}B{j} and {s}I{j}: B is the whole backward, "
                "I and W its halves"
            )
        missing = np.flatnonzero(at[Kind.FORWARD] < 0)
        if not missing.size:
            split = at[Kind.INPUT] >= 0
            missing = np.flatnonzero(~split & (at[Kind.BACKWARD] < 0))
        if missing.size:
            j = int(missing[0])
            k = Kind.FORWARD if at[Kind.FORWARD][j] < 0 else Kind.BACKWARD
            raise ScheduleError(f"missing action {s}{k.letter}{j} on stage {s}")
        nw = np.flatnonzero((at[Kind.INPUT] >= 0) & (at[Kind.WEIGHT] < 0))
        if nw.size:
            raise ScheduleError(f"missing action {s}W{int(nw[0])} on stage {s}")
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


def grid(
    schedule: Schedule, mark: dict[int, int] | None = None, max_steps: int | None = None
) -> str:
    """The per-rank action grid: one row per step, one column per rank (torch's
    ``_format_pipeline_order`` layout); step k holds each rank's k-th action.

    ``mark`` {rank: position} flags those actions with ``*`` (the blocked ones of
    a deadlock); ``max_steps`` cuts long grids (the rows kept are said).
    """
    ranks = schedule.rank_actions
    mark = mark or {}
    steps = max((len(a) for a in ranks), default=0)
    cells = [
        [
            (str(a[k]) + ("*" if mark.get(r) == k else "")) if k < len(a) else ""
            for r, a in enumerate(ranks)
        ]
        for k in range(steps)
    ]
    width = max([len(c) for row in cells for c in row] + [len(f"Rank {len(ranks) - 1}")])
    label = len(f"Step {max(steps - 1, 0):02d}:")
    head = " " * label + " " + " ".join(f"Rank {r}".ljust(width) for r in range(len(ranks)))
    rows = [head.rstrip()]
    shown = range(steps) if max_steps is None or steps <= max_steps else range(max_steps)
    for k in shown:
        row = " ".join(c.ljust(width) for c in cells[k])
        rows.append(f"{f'Step {k:02d}:':<{label}} {row}".rstrip())
    if len(shown) < steps:
        rows.append(f"... {steps - len(shown)} more steps")
    if mark:
        rows.append("* the action the rank is blocked at")
    return "\n".join(rows)


def max_in_flight(schedule: Schedule) -> list[int]:
    """Largest number of items forwarded but not yet backwarded, per stage."""
    return [int(np.max(np.cumsum(_stash_steps(c)), initial=0)) for c in schedule.codes]


def _stash_steps(codes: np.ndarray) -> np.ndarray:
    """+1 per F (its input is stashed), −1 per B or W (the stash is freed), 0 per I."""
    k = kinds(codes)
    return np.where(k == Kind.FORWARD, 1, np.where(k == Kind.INPUT, 0, -1))


def peak_stash(schedule: Schedule, item_bytes: Sequence[float] | None = None) -> list[float]:
    """Peak stashed activations per rank, over the rank's list order.

    An F stashes its item's input until the item's B (or W, which still needs
    it after I) on the same stage frees it; a rank holds the sum over its
    stages. With ``item_bytes[s]`` (bytes one item stashes on stage s) the
    peak is in bytes, else in items. It depends only on each rank's order,
    not on the costs: a rank runs its list in order whatever the timing.
    """
    n = schedule.n_items
    w = None if item_bytes is None else np.asarray(item_bytes, dtype=np.float64)
    out: list[float] = []
    for o in schedule.order:
        st = stages_of(o, n)
        step = _stash_steps(codes_of(o, n)).astype(np.float64)
        if w is not None:
            step = step * w[st]
        peak = float(np.max(np.cumsum(step), initial=0.0))
        out.append(peak if w is not None else int(peak))
    return out
