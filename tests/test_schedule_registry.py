"""The schedule registry: CLI choices, configuration, and a user's own schedule under MPI."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hpcpipe
from hpcpipe.cli.main import build_parser
from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.simulator import closed_form, message_costs, simulate, stage_times
from hpcpipe.registry import RegistryError
from hpcpipe.run.config import ConfigError, make_config
from hpcpipe.run.results import load as load_result

OUTSIDE = Path(__file__).parent / "outside"
ENV = dict(
    os.environ,
    OMP_NUM_THREADS="1",
    OPENBLAS_NUM_THREADS="1",
    PYTHONPATH=os.pathsep.join([str(OUTSIDE), os.environ.get("PYTHONPATH", "")]),
)


def _positional(parser, command, dest):
    sub = next(a for a in parser._actions if a.dest == "command")
    return next(a for a in sub.choices[command]._actions if a.dest == dest)


def test_cli_schedule_choices_are_the_registry():
    parser = build_parser()
    builtin = [n for n in schedules.SCHEDULES.names() if ":" not in n]
    assert builtin[:3] == ["sequential", "gpipe", "1f1b"]
    for command, dest in (("schedule", "kind"), ("simulate", "schedule")):
        assert list(_positional(parser, command, dest).choices) == builtin
    schedules.register_schedule("test-choice", schedules.gpipe, replace=True)
    assert "test-choice" in list(_positional(build_parser(), "simulate", "schedule").choices)


def test_register_schedule_is_reexported_and_known_everywhere():
    assert hpcpipe.register_schedule is schedules.register_schedule

    @hpcpipe.register_schedule("test-lifo", replace=True)
    def lifo(S, n):
        sch = schedules.gpipe(S, n)
        fwd, bwd = np.split(sch.codes[0], 2)
        return schedules.Schedule("test-lifo", S, n, [np.concatenate([fwd, bwd[::-1]])] * S)

    assert make_config({"schedule": "test-lifo"}).schedule == "test-lifo"
    sch = schedules.build("test-lifo", 3, 4).validate()
    assert [str(a) for a in sch.actions[1]][4:] == ["1B3", "1B2", "1B1", "1B0"]
    with pytest.raises(ValueError, match="no closed form"):
        closed_form("test-lifo", 3, 4, 1.0, 1.0)
    with pytest.raises(RegistryError, match="already registered"):
        hpcpipe.register_schedule("test-lifo", lifo)


def test_bad_schedule_names_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="schedule = 'gpipee'.*did you mean 'gpipe'"):
        make_config({"schedule": "gpipee"})
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        make_config({"schedule": "no_such_module:builder"})
    with pytest.raises(schedules.ScheduleError, match="unknown schedule 'zigzag'"):
        schedules.build("zigzag", 2, 2)


def _hpcpipe(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=cwd,
    )


def test_cli_refuses_bad_schedule_with_exit_2():
    p = _hpcpipe("simulate", "user_schedules:DEADLOCK")
    assert p.returncode == 2 and "neither a builder" in p.stderr, p.stderr
    p = _hpcpipe("schedule", "gpipee")
    assert p.returncode == 2 and "did you mean 'gpipe'" in p.stderr, p.stderr
    p = _hpcpipe("run", "--np", "2", "--depth", "2", "--schedule", "nosuch:build")
    assert p.returncode == 2 and "cannot import module 'nosuch'" in p.stderr, p.stderr
    p = _hpcpipe("schedule", "user_schedules:pairs", "--stages", "2", "--items", "3")
    assert p.returncode == 0, p.stderr
    assert "stage   1 | 1F0 1F1 1B1 1B0 1F2 1B2" in p.stdout


def test_outside_schedule_runs_under_mpi_and_equals_the_simulator_bitwise(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(OUTSIDE))
    S, depth, K, dim = 2, 2, 5, 16
    tf, tb, alpha, beta = 1.0, 2.5, 0.3, 0.01
    p = _hpcpipe(
        "run",
        "--np",
        str(S),
        "--schedule",
        "user_schedules:lifo",
        "--problem",
        "l1-chain",
        "--dim",
        str(dim),
        "--depth",
        str(depth),
        "--optimizer",
        "pprs",
        "--samples",
        str(K),
        "--gamma",
        "0.01",
        "--iterations",
        "2",
        "--progress",
        "off",
        "--clock",
        "model",
        "--t_forward",
        str(tf),
        "--t_backward",
        str(tb),
        "--alpha",
        str(alpha),
        "--beta",
        str(beta),
        "--output",
        "r.h5",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    r = load_result(tmp_path / "r.h5")
    assert r.config["schedule"] == "user_schedules:lifo"
    costs = CostModel.uniform(depth, tf, tb, alpha, beta)
    sim = simulate(
        schedules.build("user_schedules:lifo", S, K),
        *stage_times(costs, depth, S),
        message_costs(costs, [dim] * (S - 1), [1] * K),
    )
    assert r.iterations["pipeline_time"][0] == sim.makespan  # bitwise
    tl = r.timeline
    for s in range(S):
        sel = (tl["iteration"] == 1) & (tl["stage"] == s)
        np.testing.assert_array_equal(tl["end"][sel], sim.ends[s])
        assert tl["item"][sel][K:].tolist() == list(range(K))[::-1]  # the user's order ran
