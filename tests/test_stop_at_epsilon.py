"""stop_at_epsilon: a run stops at its first evaluation with f − f* <= ε, so its pipeline
time is the time to ε; the rows up to there are those of the run that goes on."""

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.errors import ConfigError
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run

BASE = dict(
    problem="nesterov-chain",
    depth=4,
    dim=16,
    mode="theory",
    optimizer="gd",
    epsilon=0.09375,
    executor="simulated",
    stages=4,
    progress="off",
)


def test_the_run_stops_where_epsilon_is_first_reached():
    full = run(make_config(BASE), MPI.COMM_SELF)
    gap = full.column("gap")
    first = int(np.flatnonzero(gap <= BASE["epsilon"])[0])
    assert first + 1 < len(gap), "the instance must reach epsilon before its planned T"
    short = run(make_config({**BASE, "stop_at_epsilon": 1}), MPI.COMM_SELF)
    assert len(short.table) == first + 1
    np.testing.assert_array_equal(short.table[:, :-1], full.table[: first + 1, :-1])
    assert short.info["stopped_at_epsilon"] == first + 1
    assert short.info["epsilon_reached_at_iteration"] == first + 1
    assert short.column("pipeline_time")[-1] == full.column("pipeline_time")[first]


def test_without_the_setting_the_run_goes_to_its_planned_t():
    full = run(make_config(BASE), MPI.COMM_SELF)
    assert len(full.table) == full.info["iterations_planned"]
    assert "stopped_at_epsilon" not in full.info


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(stop_at_epsilon=2), "stop_at_epsilon"),
        (dict(mode="practical", epsilon=0.0), "epsilon"),
        (dict(eval_every=0), "eval_every"),
    ],
)
def test_stop_at_epsilon_needs_a_target_and_evaluations(change, field):
    with pytest.raises(ConfigError, match=field):
        make_config({**BASE, "stop_at_epsilon": 1, **change})
