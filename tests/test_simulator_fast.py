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
