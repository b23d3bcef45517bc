"""A run states the guarantee it planned and whether it reached epsilon, and stores both."""

import json

from mpi4py import MPI

from hpcpipe.run.config import make_config
from hpcpipe.run.outcome import describe
from hpcpipe.run.results import load
from hpcpipe.run.runner import run


def small(tmp_path, name, **kw):
    base = dict(problem="l1-chain", depth=2, dim=4, progress="off", output=str(tmp_path / name))
    return make_config({**base, **kw})


def test_theory_run_stores_and_prints_its_guarantee_and_reaching_epsilon(tmp_path, capsys):
    cfg = small(tmp_path, "t.h5", optimizer="gd", mode="theory", epsilon=0.5)
    res = run(cfg, MPI.COMM_SELF)
    stored = json.loads(load(cfg.output).attrs["info"])
    assert stored["guarantee"].startswith("min f-f* <= RL/sqrt(T)")
    gap = res.column("gap")
    first = int(res.column("iteration")[(gap <= 0.5).argmax()])
    assert stored["epsilon_reached"] is True and stored["epsilon_reached_at_iteration"] == first
    assert stored["best_gap"] == min(g for g in gap if g == g)
    lines = describe(stored)
    assert lines[0].startswith("guarantee planned (theory mode): min f-f*")
    assert f"first at iteration {first}" in lines[1]


def test_a_missed_epsilon_is_said_and_stored(tmp_path):
    cfg = small(tmp_path, "p.h5", optimizer="gd", lr=1e-4, iterations=3, epsilon=1e-3)
    res = run(cfg, MPI.COMM_SELF)
    stored = json.loads(load(cfg.output).attrs["info"])
    assert stored["epsilon_reached"] is False and "guarantee" not in stored
    assert stored["best_gap"] > 1e-3
    assert describe(res.info) == [
        f"epsilon 0.001 NOT reached: best f - f* {stored['best_gap']:.4g}"
    ]
