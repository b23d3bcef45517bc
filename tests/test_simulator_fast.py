"""The simulator's vectorised kernels against the reference walk, bit for bit."""

import numpy as np
import pytest

from hpcpipe.pipeline import schedules, wavefront
from hpcpipe.pipeline.schedules import Kind, Schedule, encode
from hpcpipe.pipeline.simulator import simulate

SIZES = [(1, 1), (1, 5), (5, 1), (2, 2), (3, 7), (7, 3), (4, 4), (6, 13), (13, 6), (8, 31), (17, 9)]


def _costs(S, n, seed, kind="random"):
    g = np.random.default_rng(seed)
    if kind == "uniform":  # ties everywhere: max() sees equal arguments
        return np.ones(S), np.ones(S), np.full((S - 1, n), 0.0)
    tf, tb = g.uniform(0, 3, S), g.uniform(0, 3, S)
    msg = g.uniform(0, 2, (S - 1, n))
    if kind == "sparse":  # some zero costs and some zero messages
        tf[g.random(S) < 0.3] = 0.0
        msg[g.random(msg.shape) < 0.5] = 0.0
    return tf, tb, msg


def _lifo(S, n):
    i = np.arange(n)
    codes = np.concatenate([encode(i, Kind.FORWARD), encode(i[::-1], Kind.BACKWARD)])
    return Schedule("lifo", S, n, [codes] * S)


def _assert_same(fast, ref):
    assert fast.makespan == ref.makespan
    assert fast.stage_end == ref.stage_end
    np.testing.assert_array_equal(fast.end_f, ref.end_f)
    np.testing.assert_array_equal(fast.end_b, ref.end_b)
    for a, b in zip(fast.ends, ref.ends):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b"])
@pytest.mark.parametrize(("S", "n"), SIZES)
@pytest.mark.parametrize("kind", ["random", "sparse", "uniform"])
def test_builtin_kernels_equal_the_walk_bitwise(name, S, n, kind):
    sch = schedules.build(name, S, n)
    tf, tb, msg = _costs(S, n, seed=S * 1000 + n, kind=kind)
    fast = simulate(sch, tf, tb, msg)
    assert fast.method != "walk"  # a vectorised kernel ran
    _assert_same(fast, simulate(sch, tf, tb, msg, method="walk"))


@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b", "lifo"])
@pytest.mark.parametrize(("S", "n"), SIZES)
def test_rounds_kernel_equals_the_walk_on_any_schedule(name, S, n):
    sch = _lifo(S, n) if name == "lifo" else schedules.build(name, S, n)
    tf, tb, msg = _costs(S, n, seed=n * 1000 + S)
    end_f, end_b = wavefront.rounds(sch, tf, tb, msg, probe=10**9)
    ref = simulate(sch, tf, tb, msg, method="walk")
    np.testing.assert_array_equal(end_f, ref.end_f)
    np.testing.assert_array_equal(end_b, ref.end_b)


def test_user_schedule_uses_rounds_when_wide_and_walk_when_serial():
    S, n = 40, 60
    tf, tb, msg = _costs(S, n, seed=3)
    wide = simulate(_lifo(S, n), tf, tb, msg)
    assert wide.method == "rounds"
    _assert_same(wide, simulate(_lifo(S, n), tf, tb, msg, method="walk"))
    seq = schedules.sequential(S, n)
    serial = Schedule("mine", S, n, seq.codes)  # same lists, not from the builder
    got = simulate(serial, tf, tb, msg)
    assert got.method == "walk"
    _assert_same(got, simulate(seq, tf, tb, msg))


def test_kernels_refuse_what_they_cannot_do_exactly():
    S, n = 4, 6
    tf, tb, msg = _costs(S, n, seed=5)
    # negative costs: the chain's running sum is not the walk's max; the walk is used
    neg = simulate(schedules.sequential(S, n), tf - 1.0, tb, msg)
    assert neg.method != "chain"
    _assert_same(neg, simulate(schedules.sequential(S, n), tf - 1.0, tb, msg, method="walk"))
    # a built-in's name and shape on other lists: the builder's kernel is not used
    sch = schedules.gpipe(S, n)
    sch.codes = _lifo(S, n).codes
    _assert_same(simulate(sch, tf, tb, msg), simulate(sch, tf, tb, msg, method="walk"))
    with pytest.raises(ValueError, match=r"expected \(S - 1, n\) = \(3, 6\)"):
        simulate(schedules.gpipe(S, n), tf, tb, msg[:, :2])
    one = simulate(schedules.gpipe(1, n), tf[:1], tb[:1], [])  # one stage, no boundary
    assert one.makespan == simulate(schedules.gpipe(1, n), tf[:1], tb[:1], method="walk").makespan
    # one column per boundary: the same as the full table
    col = msg[:, :1]
    _assert_same(
        simulate(schedules.one_f_one_b(S, n), tf, tb, col),
        simulate(schedules.one_f_one_b(S, n), tf, tb, np.repeat(col, n, axis=1), method="walk"),
    )


def test_deadlock_is_named_on_the_fast_path_too():
    lists = [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]
    bad = Schedule.from_lists("bad", 2, lists)
    with pytest.raises(schedules.ScheduleError, match="stage 0 waits at 0B0 for 1B0"):
        simulate(bad, [1.0, 1.0], [1.0, 1.0])


BUILTIN = schedules.builtin_names()
# (ranks, items): one rank, one item, n < S, n > S, and sizes where simulate() itself takes
# a kernel (at least 4096 actions); interleaved-1f1b needs n a multiple of the ranks
FAST_SIZES = [(1, 1), (1, 4), (4, 1), (2, 6), (3, 3), (4, 8), (5, 10), (16, 128), (64, 64)]


def _random_costs(sch, seed):
    g = np.random.default_rng(seed)
    S, n = sch.n_stages, sch.n_items
    tf, tb, ti, tw = (g.uniform(0.0, 2.0, S) for _ in range(4))
    msg = g.uniform(0.0, 1.0, (S - 1, n))
    msg[g.random(msg.shape) < 0.2] = 0.0  # some free messages: ties in the max
    return tf, tb, msg, ti, tw


def _assert_all_equal(got, ref):
    """Every table (NaN where a kind does not run), rank ends, makespan and busy time."""
    assert got.makespan == ref.makespan
    assert got.stage_end == ref.stage_end
    assert got.busy == ref.busy
    for a, b in zip(got.by_kind, ref.by_kind):
        if a is None:  # a kernel of F and B only: the walk ran no I or W either
            assert np.isnan(b).all()
        else:
            np.testing.assert_array_equal(a, b)  # NaN equals NaN here
    for a, b in zip(got.ends, ref.ends):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize(("P", "n"), FAST_SIZES)
def test_every_builtin_fast_path_equals_the_walk_bitwise(name, P, n):
    try:
        sch = schedules.build(name, P, n)
    except schedules.ScheduleError:
        pytest.skip(f"{name} is not defined for {P} ranks and {n} items")
    tf, tb, msg, ti, tw = _random_costs(sch, seed=P * 1000 + n)
    ref = simulate(sch, tf, tb, msg, method="walk", t_input=ti, t_weight=tw)
    got = simulate(sch, tf, tb, msg, t_input=ti, t_weight=tw)
    _assert_all_equal(got, ref)
    if P >= 64 and name != "sequential":  # (sequential is too serial for rounds: walked)
        assert got.method != "walk"  # a kernel ran (rounds needs >= 16 ranks busy a round)
    # the generic kernel on its own, at every size (simulate walks the small ones)
    by_kind, ends = wavefront.rounds_timing(sch, tf, tb, msg, probe=10**9, ti=ti, tw=tw)
    assert ends.tolist() == ref.stage_end
    for a, b in zip(by_kind, ref.by_kind):
        np.testing.assert_array_equal(a, b)


def test_rounds_with_b_on_some_stages_and_i_w_on_others():
    # 1F1B whose stage 1 splits every backward into I then W: the gradient stage 0 waits
    # for comes from an I, the one stage 1 waits for from a B
    S, n = 3, 5
    lists = [list(map(str, a)) for a in schedules.one_f_one_b(S, n).actions]
    lists[1] = [a.replace("B", "I") + (f" 1W{a[2:]}" if "B" in a else "") for a in lists[1]]
    lists[1] = [x for a in lists[1] for x in a.split()]
    sch = Schedule.from_lists("mixed", n, lists).validate()
    tf, tb, msg, ti, tw = _random_costs(sch, seed=9)
    by_kind, ends = wavefront.rounds_timing(sch, tf, tb, msg, probe=10**9, ti=ti, tw=tw)
    ref = simulate(sch, tf, tb, msg, method="walk", t_input=ti, t_weight=tw)
    assert ends.tolist() == ref.stage_end
    for a, b in zip(by_kind, ref.by_kind):
        np.testing.assert_array_equal(a, b)
    assert not np.isnan(by_kind[Kind.INPUT][1]).any() and np.isnan(by_kind[Kind.BACKWARD][1]).all()


def test_an_action_listed_twice_is_left_to_the_walk():
    S, n = 40, 60
    sch = _lifo(S, n)
    codes = list(sch.codes)
    codes[3] = np.concatenate([codes[3], codes[3][-1:]])  # its last B once more
    dup = Schedule("dup", S, n, codes)
    tf, tb, msg = _costs(S, n, seed=4)
    with pytest.raises(schedules.ScheduleError, match="twice"):
        wavefront.rounds_timing(dup, tf, tb, msg, probe=10**9)
    got = simulate(dup, tf, tb, msg)
    assert got.method == "walk"
    assert got.makespan == simulate(dup, tf, tb, msg, method="walk").makespan


@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b"])
def test_builtin_kernels_only_on_the_builders_own_lists(name):
    S, n = 5, 7
    tf, tb, msg = _costs(S, n, seed=6)
    sch = schedules.build(name, S, n)
    assert sch.builders_lists and simulate(sch, tf, tb, msg).method != "walk"
    with pytest.raises(ValueError):  # read-only: the lists cannot change under the kernel
        sch.codes[0][0] = sch.codes[0][1]
    writable = schedules.build(name, S, n)
    writable.codes[1].setflags(write=True)
    assert not writable.builders_lists
    assert simulate(writable, tf, tb, msg).method == "walk"
    mine = Schedule(name, S, n, schedules.build(name, S, n).codes, shape=name)
    assert not mine.builders_lists  # the same shape from elsewhere: not trusted
    assert simulate(mine, tf, tb, msg).method == "walk"


@pytest.mark.parametrize("name", ["interleaved-1f1b", "zb-v"])
def test_rounds_with_64_bit_cells_equals_the_walk(name, monkeypatch):
    # the 64-bit path (tables of more than 2^31 cells) on a small schedule
    monkeypatch.setattr(wavefront, "_INT32_CELLS", 0)
    sch = schedules.build(name, 4, 8)
    tf, tb, msg, ti, tw = _random_costs(sch, seed=12)
    by_kind, ends = wavefront.rounds_timing(sch, tf, tb, msg, probe=10**9, ti=ti, tw=tw)
    ref = simulate(sch, tf, tb, msg, method="walk", t_input=ti, t_weight=tw)
    assert ends.tolist() == ref.stage_end
    for a, b in zip(by_kind, ref.by_kind):
        np.testing.assert_array_equal(a, b)


def test_builtin_names_leave_out_schedules_registered_elsewhere(monkeypatch):
    monkeypatch.setattr(schedules.SCHEDULES, "_entries", dict(schedules.SCHEDULES._entries))
    schedules.register_schedule("lifo-extra", _lifo)
    assert "lifo-extra" in schedules.SCHEDULES.names()
    assert "lifo-extra" not in schedules.builtin_names()
    assert {"sequential", "gpipe", "1f1b", "zb-v"} <= set(schedules.builtin_names())
