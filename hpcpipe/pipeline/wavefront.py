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
* ``one_f_one_b_steps`` (1F1B): F(s, i) at step 2i + s + 1 and B(s, j) at
  2S − s + 2j respect every dependency, and a step's actions lie on a few
  strided lines of padded matrices.
* ``rounds`` (any valid schedule: interleaved 1F1B, looped BFS, ZB-H1, ZB-V,
  one's own): in each round every rank whose next action has its input runs
  it; a round is a dozen numpy calls over the R ranks. It needs as many
  rounds as the longest dependency path has actions, 2(n + S) for the
  fill-drain family, so it is abandoned for the walk when a schedule is too
  serial for it.
"""

from __future__ import annotations

import numpy as np

from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.schedules import Kind, Schedule

INF = np.inf
_INT32_CELLS = 2**31  # rounds: 32-bit cells below this many (a test lowers it)


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

    See ``rounds_timing``; entries of actions a stage does not run are NaN, as
    in the walk.
    """
    return rounds_timing(schedule, tf, tb, msg, probe, min_per_round, ti, tw)[0]


def rounds_timing(
    schedule: Schedule,
    tf: np.ndarray,
    tb: np.ndarray,
    msg: np.ndarray,
    probe: int | None = None,
    min_per_round: float = 16.0,
    ti: np.ndarray | None = None,
    tw: np.ndarray | None = None,
):
    """((end_f, end_b, end_i, end_w), rank ends) of any complete schedule, by rounds.

    In each round every rank whose next action has its input runs it: a
    dozen numpy calls over the R ranks, whatever the schedule. Per action,
    only its own cell and its dependency's cell are computed beforehand (8
    bytes with 32-bit cells); its message and its cost are gathered in the
    round, as one pair, from a table laid out like the end times (a
    per-action table of floats costs more to build and to fault in). An
    action's end is max(E[dependency] + message, rank clock) + t_kind, the
    walk's operations on the walk's operands
    (``schedules.walk``), so the floats are the same bit for bit: an action
    without a dependency reads a -inf cell (max(-inf + c, clock) = clock), a
    waiting one reads +inf (its dependency has not run) and moves on only once
    that cell is written.

    End times live in one (S + 4, nn) table per kind that occurs, indexed by
    (stage, item): row s + 1 is stage s, rows 0 and S + 1 are -inf (the
    dependencies of stage 0's forwards and of the last stage's gradients), row
    S + 2 is +inf (a cell no rank writes: where a rank past its list waits)
    and row S + 3 is where it writes. A gradient dependency reads the table of
    the kind its stage sends it with (B, or I where it splits its backward). A
    hand-off between two stages of one rank costs no message.

    Raises TooSerial when, after ``probe`` rounds, fewer than ``min_per_round``
    actions ran per round on average (the walk is then faster), and
    ScheduleError when no rank can move (a deadlock or a missing action: the
    walk names it) or when an action appears twice (the walk's order decides
    which one a consumer reads).
    """
    S, n, R = schedule.n_stages, schedule.n_items, schedule.n_ranks
    probe = 2 * R + 64 if probe is None else probe
    if ti is None or tw is None:
        ti, tw = schedules.split_backward(tb)
    NK = schedules.N_KINDS
    rows = S + 4
    # a table row is nn >= n floats, nn = 8 mod 16: an odd number of cache lines, so
    # that the cells of one round (in different rows) fall in different cache sets
    nn = n + (8 - n) % 16
    plane = rows * nn
    pad = schedules.place(S + 2, schedules.encode(0, Kind.FORWARD), n)
    order = schedule.order
    # 32-bit codes and cells where they fit (every cell < E's length): half the traffic
    itype = np.int32 if NK * plane + 1 < _INT32_CELLS else np.int64
    # every rank's list followed by one pad: the rank parks there
    codes = np.concatenate([x for o in order for x in (o, [pad])], dtype=itype)
    lengths = np.array([len(o) + 1 for o in order], dtype=np.int64)
    first = np.cumsum(lengths) - lengths
    kind = schedules.kinds(codes)
    kinds_run = np.bincount(kind, minlength=NK)
    kinds_run[Kind.FORWARD] -= R  # the pads
    present = [k for k in Kind if kinds_run[k] > 0 or k == Kind.FORWARD]
    at = {k: p for p, k in enumerate(present)}
    E = np.full(len(present) * plane + 1, INF)
    none = len(E) - 1  # E[none] = -inf: no dependency
    E[none] = -INF
    tables = E[:-1].reshape(len(present), rows, nn)
    tables[:, 0] = -INF
    tables[:, S + 1] = -INF
    off = np.zeros(NK, dtype=np.int64)  # own cell = off[kind] + stage·nn + item
    for k, p in at.items():
        off[k] = p * plane + nn
    # per action (rank by rank, each list followed by its pad): its own cell and its
    # dependency's cell, the row above (F) or below (B, I) in the sender's table
    key = schedules.keys_of(codes, n)  # stage·n + item
    key += (key // n) * (nn - n)  # stage·nn + item
    pairs = np.empty((len(codes), 2), dtype=itype)
    own, dep = pairs[:, 0], pairs[:, 1]
    np.add(key, off.astype(itype).take(kind, mode="clip"), out=own)
    grad = [k for k in (Kind.BACKWARD, Kind.INPUT) if k in at]
    delta = np.zeros(NK, dtype=itype)
    delta[Kind.FORWARD] = -nn
    if len(grad) == 1:
        delta[grad[0]] = nn
    np.add(own, delta.take(kind, mode="clip"), out=dep)
    if len(grad) == 2:  # B on some stages and I on others: the sender per (stage, item)
        sender = np.full(plane, off[Kind.BACKWARD], dtype=itype)
        is_i = kind == Kind.INPUT
        sender[key[is_i]] = off[Kind.INPUT]
        mine = (kind == Kind.BACKWARD) | is_i
        up = key[mine] + nn
        dep[mine] = up + sender.take(up, mode="clip")
    if Kind.WEIGHT in at:
        np.copyto(dep, none, where=kind == Kind.WEIGHT)
    del kind, key
    # the message an action receives, in a table laid out like E: boundary s - 1 for a
    # forward, s for a gradient (rows b + 1 of ``mz``; 0 elsewhere: a W or a pad adds it
    # to -inf or +inf)
    local = schedules.local_hops(schedule)
    mz = np.zeros((S + 1, n))
    if S > 1:
        np.copyto(mz[1:S], msg)
        mz[1:S][local] = 0.0
    # and its cost (the same floats as the walk's t_kind), both by its own cell: one
    # gather per round reads the pair
    MT = np.zeros((len(E), 2))
    into = MT[:-1].reshape(len(present), rows, nn, 2)
    for k, p in at.items():
        if k != Kind.WEIGHT:
            lo = 0 if k == Kind.FORWARD else 1
            into[p, 1 : S + 1, :n, 0] = mz[lo : lo + S]
        into[p, 1 : S + 1, :, 1] = np.asarray((tf, tb, ti, tw)[k], dtype=np.float64)[:, None]
    MT = MT.view(np.complex128).reshape(-1)
    total = len(schedule)
    cur = first.copy()
    clock = np.zeros(R)
    d, mt = np.empty(R), np.empty(R, dtype=np.complex128)
    m, t = mt.real, mt.imag
    sd = np.empty((R, 2), dtype=itype)
    pair = np.int64 if itype == np.int32 else np.complex128
    flat, sdv = pairs.view(pair).reshape(-1), sd.view(pair).reshape(-1)
    # both as native contiguous indices (one copy): numpy gathers and scatters faster
    native = np.empty((2, R), dtype=np.intp)
    cell, di = native[0], native[1]
    ok = np.empty(R, dtype=bool)
    done, r, base = 0, 0, int(first.sum())
    # mode "clip": the indices are in range by construction (numpy's check costs more)
    while done < total:
        flat.take(cur, out=sdv, mode="clip")
        np.copyto(native, sd.T)
        E.take(di, out=d, mode="clip")
        MT.take(cell, out=mt, mode="clip")
        np.add(d, m, out=d)
        np.maximum(d, clock, out=d)
        np.add(d, t, out=d)
        E[cell] = d  # a rank that waits writes +inf over its own +inf
        np.less(d, INF, out=ok)
        np.copyto(clock, d, where=ok)
        np.add(cur, ok, out=cur)
        r += 1
        if r % 16 == 0 or r == probe:
            now = int(cur.sum()) - base
            if now == done:
                raise schedules.ScheduleError("schedule deadlocks")
            done = now
            if r == probe and done < min_per_round * r:
                raise TooSerial(done, r)
    out = []
    written = 0
    for k in Kind:
        if k not in at:
            out.append(np.full((S, n), np.nan))
            continue
        e = tables[at[k], 1 : S + 1, :n]
        unrun = e == INF
        missing = int(np.count_nonzero(unrun))
        written += e.size - missing
        if missing:
            np.copyto(e, np.nan, where=unrun)
        out.append(e)
    if written != total:
        raise schedules.ScheduleError("an action appears twice")
    return tuple(out), clock


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
