"""The runner's f(θ) answer served to the next oracle call (run/runner.py ``exact_f``, ``oracle``).

GD's next point is its last iterate (y_{t+1} = θ_{t+1}), whose f the runner has just
evaluated; on an executor timed by the model (simulated, reduced) with γ = 0 and K = 1 that
evaluation is the oracle's call, so it is computed once. The run must be bitwise the run
that computes both, with one evaluation per iteration instead of two.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.pipeline import reduced
from hpcpipe.pipeline.simulated import SimulatedPipeline
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run

BASE = {
    "problem": "nesterov-chain",
    "dim": 32,
    "depth": 4,
    "mode": "practical",
    "lr": 0.02,
    "iterations": 60,
    "epsilon": 0.05,
    "progress": "off",
    "output": "",
}


def _counted(monkeypatch, reuse: bool) -> list[int]:
    calls = [0]
    inner = SimulatedPipeline.evaluate

    def counting(self, *a, **k):
        calls[0] += 1
        return inner(self, *a, **k)

    monkeypatch.setattr(SimulatedPipeline, "evaluate", counting)
    monkeypatch.setattr(SimulatedPipeline, "timed_by_model", reuse)
    return calls


@pytest.mark.parametrize(
    "values, oracle_calls",
    [
        ({"optimizer": "gd", "gamma": 0.0, "samples": 1}, 0),
        (
            {
                "optimizer": "gd",
                "gamma": 0.0,
                "samples": 1,
                "executor": "reduced",
                "layers": "householder",
                "depth": 16,
            },
            0,
        ),
        # AGD: y_t = θ_t + μ_t(θ_t − θ_{t−1}) is θ only at t = 1 (μ = 0)
        ({"optimizer": "agd", "gamma": 0.0, "samples": 1}, 59),
        ({"optimizer": "pprs", "gamma": 0.01, "samples": 2, "lr": 0.002}, 60),  # γ > 0
    ],
)
def test_the_kept_answer_is_bitwise_the_computed_one(monkeypatch, values, oracle_calls):
    cfg = make_config({**BASE, "executor": "simulated", **values})
    tables, counts = [], []
    for reuse in (False, True):
        reduced.clear_memo()  # the reduced route's answers kept across runs
        with monkeypatch.context() as m:
            calls = _counted(m, reuse)
            res = run(cfg, MPI.COMM_SELF)
        tables.append(res.table[:, :-1])  # every column but the wall time
        counts.append(calls[0])
    T = len(tables[0])
    assert T == cfg.iterations
    np.testing.assert_array_equal(tables[0], tables[1])
    assert counts[0] == 2 * T + 1  # f(θ₀), then an oracle call and f per iteration
    assert counts[1] == T + 1 + oracle_calls  # the oracle calls that were computed


def test_mpi_engine_never_serves_a_kept_answer():
    """On the MPI engine a call's time is measured: every call runs (no ``timed_by_model``)."""
    from hpcpipe.pipeline.engine import Engine

    assert not getattr(Engine, "timed_by_model", False)
    assert SimulatedPipeline.timed_by_model


@pytest.mark.parametrize(
    "values, plain",
    [
        ({"optimizer": "gd", "gamma": 0.0, "samples": 1}, 0),  # f(θ) kept: always with ∇
        # AGD: only f(θ₀) is kept (t = 1, μ = 0); every f(θ_t) after an update is plain
        ({"optimizer": "agd", "gamma": 0.0, "samples": 1}, BASE["iterations"]),
    ],  # fmt: skip
)
def test_f_of_theta_runs_no_backward_when_it_cannot_be_reused(monkeypatch, values, plain):
    """``Optimizer.next_point_is_theta``: the runner asks for f(θ) without a gradient
    exactly when the next oracle call cannot be at θ, and the run is bitwise the same."""
    cfg = make_config({**BASE, "executor": "simulated", **values})
    inner = SimulatedPipeline.evaluate
    tables = []
    for ask in (True, False):
        flags = []

        def counting(self, *a, flags=flags, **k):
            flags.append(k.get("gradient", True))
            return inner(self, *a, **k)

        with monkeypatch.context() as m:
            m.setattr(SimulatedPipeline, "evaluate", counting)
            m.setattr(SimulatedPipeline, "timed_by_model", True)
            if not ask:  # the rule before it: every f(θ) with its gradient, kept
                from hpcpipe.optim import base, methods

                for cls in (base.Optimizer, methods.AGD, methods.PPRS):
                    m.setattr(cls, "next_point_is_theta", lambda self, state: True)
            res = run(cfg, MPI.COMM_SELF)
        tables.append(res.table[:, :-1])
        if ask:
            assert flags.count(False) == plain
        else:
            assert flags.count(False) == 0
    np.testing.assert_array_equal(tables[0], tables[1])
