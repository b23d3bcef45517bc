"""Vectorised timing kernels of the simulator: the same operations as the walk, in bulk.

Every action's end time is

    end = max(stage clock, end(dependency) + message) + t_kind,

with the dependency given by ``schedules.dependency``. The walk
(``schedules.walk``) evaluates it one action at a time. The kernels here
evaluate it for many independent actions per numpy call, performing for each
action the same floating-point operations on the same operands as the walk,
so the results are bitwise equal (tested against the walk):

* ``chain`` (sequential): all actions form one chain and, with costs >= 0,
  the max always picks the dependency (values along a chain never decrease
  and the stage's previous action is earlier in it); so the end times are a
  running sum, taken by ``np.add.accumulate`` (a sequential left fold) over
  the interleaved increments message, t, message, t, ...
* ``fill_drain`` (GPipe): the forward of item i on stage s depends on the
  forward of item i-1 on s and of item i on s-1, so every anti-diagonal
  s + i = d is computed at once from the previous one (strided views of a
  padded matrix, three ufunc calls per diagonal); the backwards likewise
  with the stages reversed, starting from each stage's last forward.
* ``rounds`` (any valid schedule, e.g. 1F1B): in each round every stage
  whose next action has its input runs it; a round is a dozen whole-array
  numpy calls over the S stages. It needs about (length of the longest
  dependency path) rounds, 2(n + S) for the fill-drain family, so it is
  abandoned for the walk when a schedule is too serial for it.
"""

from __future__ import annotations

import numpy as np

from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.schedules import Kind, Schedule

INF = np.inf


def same_lists(schedule: Schedule, expected: Schedule) -> bool:
    """True when ``schedule`` has exactly the action lists of ``expected``."""
    return len(schedule.codes) == len(expected.codes) and all(
        np.array_equal(a, b) for a, b in zip(schedule.codes, expected.codes)
    )


# ---------------------------------------------------------------- sequential


def chain(tf: np.ndarray, tb: np.ndarray, msg: np.ndarray, block: int = 1 << 22):
    """(end_f, end_b), each (S, n), of the sequential schedule; costs must be >= 0.

    Item i's chain is F(0,i) .. F(S-1,i), B(S-1,i) .. B(0,i), and F(0,i)
    follows B(0,i-1). The increments of one item, in chain order, are
    t_F[0], c[0], t_F[1], ..., c[S-2], t_F[S-1], t_B[S-1], c[S-2], t_B[S-2],
    ..., c[0], t_B[0]: the walk adds the message to the dependency's end,
    takes the max (which returns that sum) and adds t_kind.
    """
    S, n = len(tf), msg.shape[1]
    width = 4 * S - 2
    end_f = np.empty((S, n))
    end_b = np.empty((S, n))
    per = max(1, block // width)
    carry = 0.0
    for lo in range(0, n, per):
        hi = min(n, lo + per)
        inc = np.empty((hi - lo, width))
        inc[:, 0] = tf[0]
        inc[:, 1 : 2 * S - 1 : 2] = msg[:, lo:hi].T
        inc[:, 2 : 2 * S - 1 : 2] = tf[1:]
        inc[:, 2 * S - 1] = tb[S - 1]
        inc[:, 2 * S :: 2] = msg[::-1, lo:hi].T
        inc[:, 2 * S + 1 :: 2] = tb[S - 2 :: -1]
        flat = np.empty(inc.size + 1)
        flat[0] = carry
        flat[1:] = inc.ravel()
        np.add.accumulate(flat, out=flat)
        acc = flat[1:].reshape(hi - lo, width)
        end_f[:, lo:hi] = acc[:, 0 : 2 * S - 1 : 2].T
        end_b[::-1, lo:hi] = acc[:, 2 * S - 1 :: 2].T
        carry = flat[-1]
    return end_f, end_b


# ---------------------------------------------------------------- fill-drain


def _sweep(t: np.ndarray, msg: np.ndarray, start: np.ndarray, n: int) -> np.ndarray:
    """E[s, i] = max(E[s, i-1], E[s-1, i] + msg[s-1, i]) + t[s], E[s, -1] = start[s].

    Stage 0 has no dependency. Computed by anti-diagonals s + i = d on a
    padded matrix P[s+1, i+1] = E[s, i] whose row 0 is -inf (so the max
    returns the stage's own clock there, as the walk's plain addition does)
    and whose column 0 holds ``start``; diagonals of P are strided views.
    """
    S = len(t)
    w = n + 1
    P = np.empty((S + 1, w))
    P[0, :] = -INF
    P[1:, 0] = start
    M = np.zeros((S + 1, w))
    M[2:, 1:] = msg
    Pf, Mf = P.ravel(), M.ravel()
    buf = np.empty(S)
    for d in range(n + S - 1):
        lo, hi = max(0, d - n + 1), min(S - 1, d)
        k = hi - lo + 1
        a = lo * n + n + d + 2
        b = a + (k - 1) * n + 1
        cur = Pf[a:b:n]
        tmp = buf[:k]
        np.add(Pf[a - w : b - w : n], Mf[a:b:n], out=tmp)
        np.maximum(tmp, Pf[a - 1 : b - 1 : n], out=tmp)
        np.add(tmp, t[lo : hi + 1], out=cur)
    return P[1:, 1:]


def fill_drain(tf: np.ndarray, tb: np.ndarray, msg: np.ndarray, n: int):
    """(end_f, end_b) of GPipe: all forwards, then all backwards, on every stage."""
    S = len(tf)
    msg = msg.reshape(max(S - 1, 0), n)
    end_f = _sweep(tf, msg, np.zeros(S), n)
    end_b = _sweep(tb[::-1].copy(), msg[::-1], end_f[::-1, n - 1], n)[::-1]
    return end_f, end_b


# ---------------------------------------------------------------- any schedule


class TooSerial(Exception):
    """The rounds kernel would be slower than the walk for this schedule."""


def rounds(schedule: Schedule, tf, tb, msg, probe: int | None = None, min_per_round=16.0):
    """(end_f, end_b) of a schedule of F and B actions by ``rounds_by_kind``."""
    return rounds_by_kind(schedule, tf, tb, msg, probe, min_per_round)[:2]


def rounds_by_kind(
    schedule: Schedule,
    tf: np.ndarray,
    tb: np.ndarray,
    msg: np.ndarray,
    probe: int | None = None,
    min_per_round: float = 16.0,
    ti: np.ndarray | None = None,
    tw: np.ndarray | None = None,
):
    """End times by kind (end_f, end_b, end_i, end_w), each (S, n), of any complete schedule.

    One action per ready rank per round. End times are kept by placed code
    (stage, action code); the dependency of each list position comes from
    ``schedules.dependency`` (a gradient dependency names the B or the I that
    the producing stage runs), with no message cost between two stages of one
    rank. Raises TooSerial when, after ``probe`` rounds, fewer than
    ``min_per_round`` actions ran per round on average (the walk is then
    faster), and ScheduleError when no rank can move (a deadlock: the walk
    names the actions). Entries of actions a stage does not run are +inf.
    """
    S, n, R = schedule.n_stages, schedule.n_items, schedule.n_ranks
    probe = 2 * R + 64 if probe is None else probe
    if ti is None or tw is None:
        ti, tw = schedules.split_backward(tb)
    NC = schedules.n_codes(n)
    order = schedule.order
    lengths = np.array([len(o) for o in order])
    L = int(lengths.max())
    never, none = S * NC, S * NC + 1  # E[never] = +inf (waits forever), E[none] = -inf
    # per action, in rank order (no padding): its placed code, stage, kind and item
    placed = np.concatenate(order) if len(order) else np.zeros(0, np.int64)
    stage = schedules.stages_of(placed, n)
    codes = placed - stage * NC
    kind, item = schedules.kinds(codes), schedules.items(codes)
    # the kind that sends stage s's gradient of item i: B, or I where the stage splits
    grad = np.full((S + 1, n), int(Kind.BACKWARD), dtype=np.int64)
    is_i = kind == Kind.INPUT
    grad[stage[is_i], item[is_i]] = int(Kind.INPUT)
    local = np.concatenate([schedules.local_hops(schedule), [True]])
    msg0 = np.zeros((S, n))  # row S - 1 stays zero: "no message"
    msg0[: S - 1] = np.where(local[: S - 1, None], 0.0, msg)
    # per kind, from the one dependency rule: stage offset of the producer, whether the
    # message is the gradient (its sending kind looked up in ``grad``), the sending kind
    offset = np.zeros(schedules.N_KINDS, dtype=np.int64)
    has = np.zeros(schedules.N_KINDS, dtype=bool)
    sender = np.zeros(schedules.N_KINDS, dtype=np.int64)
    for k in Kind:
        d = schedules.DEPENDENCY[k]
        if d is not None:
            offset[k], has[k], sender[k] = d[0], True, int(d[1])
    costs = np.stack([np.asarray(t, dtype=np.float64) for t in (tf, tb, ti, tw)])
    tcost_a = costs[kind, stage]  # a selection: the same floats as the walk's t_kind
    ds = stage + offset[kind]
    valid = has[kind] & (ds >= 0) & (ds < S)
    dsv, iv, kv = ds[valid], item[valid], kind[valid]
    dk = sender[kv]
    grad_msg = dk == int(Kind.BACKWARD)
    dk[grad_msg] = grad[dsv[grad_msg], iv[grad_msg]]
    dep_a = np.full(len(placed), none, dtype=np.int64)
    dep_a[valid] = dsv * NC + schedules.encode(iv, dk)
    mcost_a = np.zeros(len(placed))
    mcost_a[valid] = msg0[np.minimum(stage[valid], dsv), iv]
    # the (R, L + 1) tables, position-major per rank; a rank past its list (and the
    # extra column) parks on a cell that waits forever
    at = np.repeat(np.arange(R, dtype=np.int64) * (L + 1), lengths)
    at += np.arange(len(placed), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    # paired columns, so that one gather per round reads both: (dependency slot, own
    # slot) and (message cost, compute cost)
    slots = np.full((R * (L + 1), 2), never, dtype=np.int64)
    slots[at, 0] = dep_a
    slots[at, 1] = placed
    cost = np.zeros((R * (L + 1), 2))
    cost[at, 0] = mcost_a
    cost[at, 1] = tcost_a
    E = np.full(S * NC + 2, INF)
    E[none] = -INF
    first = np.arange(R) * (L + 1)
    cur = first.copy()
    clock = np.zeros(R)
    d = np.empty(R)
    sl, mt = np.empty((R, 2), dtype=np.int64), np.empty((R, 2))
    di, oi, m, t = sl[:, 0], sl[:, 1], mt[:, 0], mt[:, 1]
    ok = np.empty(R, dtype=bool)
    total, done, r = int(lengths.sum()), 0, 0
    while done < total:
        np.take(slots, cur, axis=0, out=sl)
        np.take(E, di, out=d)
        np.take(cost, cur, axis=0, out=mt)
        np.add(d, m, out=d)
        np.maximum(d, clock, out=d)
        np.add(d, t, out=d)
        E[oi] = d  # a rank that waits writes +inf over its own +inf
        np.less(d, INF, out=ok)
        np.copyto(clock, d, where=ok)
        cur += ok
        r += 1
        if r % 16 == 0 or r == probe:
            now = int(cur.sum() - first.sum())
            if now == done:
                raise schedules.ScheduleError("schedule deadlocks")
            done = now
            if r == probe and done < min_per_round * r:
                raise TooSerial(done, r)
    return schedules.per_kind(E[: S * NC].reshape(S, NC))


# ---------------------------------------------------------------- 1F1B


def one_f_one_b_steps(tf: np.ndarray, tb: np.ndarray, msg: np.ndarray, n: int):
    """(end_f, end_b) of 1F1B by steps: F(s, i) at step 2i + s + 1, B(s, j) at 2S − s + 2j.

    These steps increase along every stage's list (warm-up forwards, then F
    and B alternating, then the remaining backwards) and from each action's
    dependency to it, so the actions of one step are independent and all
    their inputs are final: a step is computed at once. On a padded matrix
    the cells of one step lie on at most two lines for the forwards and four
    for the backwards (split where the previous action on the stage changes
    from a forward to a backward), each a strided view.
    """
    S = len(tf)
    w = n + 1
    PF = np.empty((S + 1, w))  # PF[s+1, i+1] = end of F(s, i); row 0: no dependency
    PF[0] = -INF
    PF[1:, 0] = 0.0
    PB = np.empty((S + 1, w))  # PB[s, j+1] = end of B(s, j); row S: no dependency
    PB[S] = -INF
    Mp = np.zeros((S + 1, w))  # Mp[s+1, i+1] = message across boundary s for item i
    Mp[1:S, 1:] = msg
    pf, pb, mp = PF.ravel(), PB.ravel(), Mp.ravel()
    buf = np.empty(S)
    fs, bs = 2 * w - 1, 2 * w + 1  # strides along a step: s += 2 with i -= 1 (F), j += 1 (B)

    def cells(out, o0, so, dd, dm, prev, p0, sp, t, s0, s1):
        k = (s1 - s0) // 2 + 1
        tmp = buf[:k]
        span = (k - 1) * so + 1
        np.add(out[o0 + dd : o0 + dd + span : so], mp[o0 + dm : o0 + dm + span : so], out=tmp)
        np.maximum(tmp, prev[p0 : p0 + (k - 1) * sp + 1 : sp], out=tmp)
        np.add(tmp, t[s0 : s1 + 1 : 2], out=out[o0 : o0 + span : so])

    def span(lo, hi, par):
        lo += (lo - par) % 2
        hi -= (hi - par) % 2
        return lo, hi

    for step in range(1, 2 * S + 2 * n - 1):
        # forwards: s = step - 1 - 2i
        par = (step - 1) % 2
        lo, hi = span(max(0, step - 1 - 2 * (n - 1)), min(S - 1, step - 1), par)
        if lo <= hi:
            cut = 2 * S - step - 1  # s <= cut: warm-up (previous action F(s, i-1))
            a, b = span(lo, min(hi, cut), par)
            if a <= b:
                o0 = (a + 1) * w + (step - 1 - a) // 2 + 1
                cells(pf, o0, fs, -w, -w, pf, o0 - 1, fs, tf, a, b)
            a, b = span(max(lo, cut + 1), hi, par)
            if a <= b:  # previous action B(s, i + s - S)
                i0 = (step - 1 - a) // 2
                o0 = (a + 1) * w + i0 + 1
                cells(pf, o0, fs, -w, -w, pb, a * w + i0 + a - S + 1, bs, tf, a, b)
        # backwards: s = 2S + 2j - step
        par = step % 2
        lo, hi = span(max(0, 2 * S - step), min(S - 1, 2 * S + 2 * n - 2 - step), par)
        if lo > hi:
            continue
        segs = []
        if S - 1 - n >= 0:  # stages whose warm-up holds every item: all F, then all B
            j0 = 2 * S - step  # s of the j = 0 cell
            if lo <= j0 <= min(hi, S - 1 - n):
                segs.append((j0, j0, pf, (j0 + 1) * w + n, 1))  # previous: F(s, n-1)
            a, b = span(max(lo, 2 * S - step + 2), min(hi, S - 1 - n), par)
            segs.append((a, b, pb, None, bs))  # previous: B(s, j-1)
        a, b = span(max(lo, S - n), min(hi, step - 2 * n - 2), par)
        segs.append((a, b, pb, None, bs))  # cooldown: previous B(s, j-1)
        a, b = span(max(lo, S - n, step - 2 * n - 1), hi, par)
        if a <= b:  # steady: previous F(s, S-1-s+j)
            j = (step - 2 * S + a) // 2
            segs.append((a, b, pf, (a + 1) * w + S - a + j, fs))
        for a, b, prev, p0, sp in segs:
            if a > b:
                continue
            o0 = a * w + (step - 2 * S + a) // 2 + 1
            cells(pb, o0, bs, w, w, prev, o0 - 1 if p0 is None else p0, sp, tb, a, b)
    return PF[1:, 1:], PB[:S, 1:]
