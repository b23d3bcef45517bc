"""Schedules are data: builders, validator and rendering."""

import pytest

from hpcpipe.pipeline import schedules as S
from hpcpipe.pipeline.schedules import Action, Schedule, ScheduleError


@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "items"), [(1, 1), (2, 1), (3, 4), (4, 16), (5, 3)])
def test_builders_are_valid_and_complete(name, stages, items):
    sch = S.build(name, stages, items).validate()
    assert len(sch) == 2 * stages * items
    order = S.execution_order(sch)
    assert len(order) == len(sch) and len(set(order)) == len(sch)


def test_1f1b_bounds_items_in_flight_gpipe_does_not():
    assert S.max_in_flight(S.one_f_one_b(4, 16)) == [4, 3, 2, 1]
    assert S.max_in_flight(S.gpipe(4, 16)) == [16] * 4
    assert S.max_in_flight(S.sequential(4, 16)) == [1] * 4


def test_1f1b_order_matches_the_textbook_pattern():
    sch = S.one_f_one_b(3, 4)
    assert [str(a) for a in sch.actions[0]] == "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3".split()
    assert [str(a) for a in sch.actions[2]] == "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3".split()


def test_action_parse_roundtrip():
    assert Action.parse("12B3") == Action(12, "B", 3)
    assert str(Action(2, "F", 0)) == "2F0"
    with pytest.raises(ScheduleError, match="cannot parse"):
        Action.parse("2X0")


def test_validator_rejects_missing_action():
    good = S.gpipe(2, 2)
    lists = [list(good.actions[0]), [a for a in good.actions[1] if str(a) != "1B1"]]
    with pytest.raises(ScheduleError, match="missing action 1B1 on stage 1"):
        Schedule.from_lists("bad", 2, lists).validate()


def test_validator_rejects_backward_before_forward():
    lists = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B1", "1F1", "1B0"]]
    with pytest.raises(ScheduleError, match="1B1 comes before its forward 1F1"):
        Schedule.from_lists("bad", 2, lists).validate()


def test_validator_rejects_deadlock():
    # stage 0 waits for item 0's gradient before it forwards item 1, while
    # stage 1 insists on item 1 first: each waits for the other
    lists = [["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]]
    msg = r"deadlocks: stage 0 waits at 0B0 for 1B0; stage 1 waits at 1F1 for 0F1"
    with pytest.raises(ScheduleError, match=msg):
        Schedule.from_lists("bad", 2, lists).validate()


def test_validator_rejects_duplicates_and_wrong_stage():
    with pytest.raises(ScheduleError, match="appears twice"):
        Schedule.from_lists("bad", 1, [["0F0", "0F0", "0B0"]]).validate()
    with pytest.raises(ScheduleError, match="is in the list of stage 0"):
        Schedule.from_lists("bad", 1, [["1F0", "0B0"]]).validate()
    with pytest.raises(ScheduleError, match="outside 0..0"):
        Schedule.from_lists("bad", 1, [["0F0", "0B0", "0F1"]]).validate()


def test_unknown_schedule_and_sizes():
    with pytest.raises(ScheduleError, match="unknown schedule 'zigzag'"):
        S.build("zigzag", 2, 2)
    with pytest.raises(ScheduleError, match="n_items must be >= 1"):
        S.gpipe(2, 0)


def test_render_lists_every_stage():
    text = S.one_f_one_b(2, 2).render()
    lines = text.splitlines()
    assert lines[0].startswith("1f1b: 2 stages, 2 items, 8 actions")
    assert lines[1].split("|")[1].split() == ["0F0", "0F1", "0B0", "0B1"]
    assert lines[2].split("|")[1].split() == ["1F0", "1B0", "1F1", "1B1"]
