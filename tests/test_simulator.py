"""Simulator against closed forms; the MPI model clock is checked in tests/mpi."""

import math

import pytest

from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.simulator import closed_form, pipeline_speedup, simulate, simulate_uniform

COSTS = [(1.0, 1.0, 0.0), (1.0, 2.0, 0.0), (0.3, 0.7, 0.05), (2.0, 1.0, 0.7), (1.0, 1.0, 3.0)]


@pytest.mark.parametrize("name", ["sequential", "gpipe"])
@pytest.mark.parametrize("S", [1, 2, 4, 7])
@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize(("tf", "tb", "c"), COSTS)
def test_closed_forms_with_messages(name, S, n, tf, tb, c):
    got = simulate_uniform(name, S, n, tf, tb, c).makespan
    assert math.isclose(got, closed_form(name, S, n, tf, tb, c), rel_tol=1e-12)


@pytest.mark.parametrize("S", [1, 2, 4, 7])
@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize(("tf", "tb"), [(1.0, 1.0), (1.0, 2.0), (0.3, 0.7)])
def test_1f1b_equals_gpipe_bubble_without_messages(S, n, tf, tb):
    got = simulate_uniform("1f1b", S, n, tf, tb).makespan
    assert math.isclose(got, closed_form("1f1b", S, n, tf, tb), rel_tol=1e-12)


@pytest.mark.parametrize("S", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 33])
@pytest.mark.parametrize(("tf", "tb", "c"), COSTS)
def test_1f1b_closed_form_with_messages(S, n, tf, tb, c):
    got = simulate_uniform("1f1b", S, n, tf, tb, c).makespan
    assert math.isclose(got, closed_form("1f1b", S, n, tf, tb, c), rel_tol=1e-12)


def test_1f1b_with_messages_meets_the_round_trip_bound():
    # stage 0 keeps at most S items in flight, each a round trip of S(tF+tB) + 2(S-1)c
    S, n, tf, tb, c = 4, 16, 1.0, 1.0, 0.5
    got = simulate_uniform("1f1b", S, n, tf, tb, c).makespan
    assert got >= (n / S) * (S * (tf + tb) + 2 * (S - 1) * c)
    assert got >= closed_form("gpipe", S, n, tf, tb, c)


def test_pipelining_speedup_over_sequential():
    for K, depth in [(1, 4), (10, 4), (100, 8)]:
        seq = simulate_uniform("sequential", depth, K, 1.0, 1.0).makespan
        gp = simulate_uniform("gpipe", depth, K, 1.0, 1.0).makespan
        assert math.isclose(seq / gp, pipeline_speedup(K, depth), rel_tol=1e-12)


def test_bubble_fraction_gpipe():
    r = simulate_uniform("gpipe", 4, 12, 1.0, 1.0)
    assert math.isclose(r.bubble_fraction, 3 / 15, rel_tol=1e-12)  # (S-1)/(n+S-1)


def test_heterogeneous_stage_costs_bottleneck():
    # the slowest stage sets the throughput: n items through a 3x slower stage
    sch = schedules.gpipe(3, 50)
    r = simulate(sch, [1.0, 3.0, 1.0], [1.0, 3.0, 1.0])
    assert r.makespan >= 50 * 6.0
    assert r.makespan <= 50 * 6.0 + 2 * (1 + 1) + 1e-9


def test_simulator_records_and_rejects_deadlock():
    r = simulate_uniform("1f1b", 2, 2, 1.0, 1.0, record=True)
    assert r.readys is not None and len(r.readys[0]) == 4
    bad = schedules.Schedule.from_lists(
        "bad", 2, [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]
    )
    with pytest.raises(schedules.ScheduleError, match="deadlocks"):
        simulate(bad, [1.0, 1.0], [1.0, 1.0])
