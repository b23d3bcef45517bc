"""The reduced route (pipeline/reduced.py): what equals the full run, and what only in law."""

import math

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.errors import ConfigError
from hpcpipe.model import rng
from hpcpipe.model.reflectors import reflector_chain
from hpcpipe.pipeline import reduced, simulated
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run
from hpcpipe.studies.depth_runs import DepthPlan, _settings

X = 16.0  # nesterov-chain at x = 16: d = k = 16, eps = RL/16


def _values(opt: str, depth: int, executor: str, **over) -> dict:
    plan = DepthPlan(xs=(X,), methods=(opt,), layers="householder")
    (_, _, _, v), *_ = _settings(plan)
    return {**v, "depth": depth, "executor": executor, "output": "", **over}


def _run(opt, depth, executor, **over) -> dict:
    reduced.clear_memo()
    res = run(make_config(_values(opt, depth, executor, **over)), MPI.COMM_SELF)
    cols = ("iteration", "loss", "f", "gap", "pipeline_time")
    return {c: np.asarray(res.column(c)) for c in cols}


def _first(cols, eps) -> float:
    hit = np.flatnonzero(np.isfinite(cols["gap"]) & (cols["gap"] <= eps))
    return float(cols["iteration"][hit[0]]) if hit.size else math.nan


def _eps(opt="gd") -> float:
    return _values(opt, 2, "simulated")["epsilon"]


@pytest.mark.parametrize("opt", ["gd", "agd"])
@pytest.mark.parametrize("depth", [4, 8, 32])
def test_without_noise_reduced_equals_full_to_rounding(opt, depth):
    full = _run(opt, depth, "simulated")
    red = _run(opt, depth, "reduced")
    assert _first(full, _eps(opt)) == _first(red, _eps(opt))
    assert np.array_equal(full["pipeline_time"], red["pipeline_time"])  # the same timing
    for c in ("loss", "f"):
        ok = np.isfinite(full[c])
        scale = np.maximum(np.abs(full[c][ok]), 1.0)
        assert np.max(np.abs(full[c][ok] - red[c][ok]) / scale) <= 1e-12, c


def test_the_comparison_can_fail():
    """Control: the comparison above sees another trajectory (PPRS's, with its noise)."""
    full = _run("gd", 8, "simulated")
    other = _run("pprs", 8, "reduced")  # smoothing noise: another trajectory
    assert np.max(np.abs(full["loss"][:50] - other["loss"][:50])) > 1e-6


def _rotated_noise(seed: int, d: int, depth: int, monkeypatch) -> None:
    """Make the reduced run draw the noise the run at ``depth`` sees in its coordinates:
    Z Q_Δ Q_{Δ₀}ᵀ (the module docstring's proof)."""
    chain = reflector_chain(seed, d, depth)
    plain = rng.noise

    def noise(s, call, pid, k, shape, dtype=np.float64):
        z = plain(s, call, pid, k, shape, dtype).reshape(-1, d)
        z = chain.backward(chain.forward(z, depth), reduced.REDUCED_DEPTH)
        return z.reshape(shape)

    monkeypatch.setattr(simulated.rng, "noise", noise)


@pytest.mark.parametrize("depth", [4, 8, 32])
def test_pprs_with_the_noise_rotated_equals_the_full_run(depth, monkeypatch):
    full = _run("pprs", depth, "simulated")
    d = _values("pprs", depth, "simulated")["dim"]
    with monkeypatch.context() as m:
        _rotated_noise(0, d, depth, m)
        red = _run("pprs", depth, "reduced")
    assert _first(full, _eps("pprs")) == _first(red, _eps("pprs"))
    for c in ("loss", "f"):
        ok = np.isfinite(full[c])
        scale = np.maximum(np.abs(full[c][ok]), 1.0)
        assert np.max(np.abs(full[c][ok] - red[c][ok]) / scale) <= 1e-12, c


def test_pprs_with_its_own_noise_differs_path_by_path():
    """Equal in law only: without the rotation the reduced PPRS run is another path."""
    full = _run("pprs", 8, "simulated")
    red = _run("pprs", 8, "reduced")
    assert np.max(np.abs(full["loss"] - red["loss"])) > 1e-6


def _counts(executor: str, seeds, scale: float = 1.0) -> np.ndarray:
    out = []
    for s in seeds:
        over = {"seed": s}
        if scale != 1.0:
            over["gamma"] = scale * _values("pprs", 8, executor)["gamma"]
        cols = _run("pprs", 8, executor, **over)
        out.append(_first(cols, _eps("pprs")))
    return np.asarray(out)


def _same_law(a: np.ndarray, b: np.ndarray) -> bool:
    """Two samples of iteration counts from one law: Mann-Whitney U at level 0.01."""
    from scipy.stats import mannwhitneyu

    return bool(mannwhitneyu(a, b).pvalue > 0.01)


@pytest.fixture(scope="module")
def full_counts():
    return _counts("simulated", range(12))


def test_pprs_iteration_counts_have_the_full_runs_law(full_counts):
    red = _counts("reduced", range(100, 112))
    assert np.isfinite(full_counts).all() and np.isfinite(red).all()
    assert _same_law(full_counts, red), (full_counts, red)


def test_the_law_test_sees_a_planted_wrong_route(full_counts):
    """A reduced route that smooths with γ × 30 has another law of counts: the test sees it."""
    wrong = _counts("reduced", range(100, 112), scale=30.0)
    assert not _same_law(full_counts, wrong), (full_counts, wrong)


def test_reduced_needs_householder_layers():
    with pytest.raises(ConfigError, match="layers"):
        make_config({**_values("gd", 8, "reduced"), "layers": "dense"})


def test_memo_returns_what_the_computation_gives():
    """Runs at two depths in one process: the second is served from the kept answers and
    records bitwise the same values, with its own depth's time."""
    reduced.clear_memo()
    a = run(make_config(_values("pprs", 64, "reduced")), MPI.COMM_SELF)
    kept = len(reduced._MEMO)
    b = run(make_config(_values("pprs", 4096, "reduced")), MPI.COMM_SELF)
    assert kept > 0 and len(reduced._MEMO) == kept  # nothing computed again
    for c in ("loss", "f", "gap"):
        assert np.array_equal(np.asarray(a.column(c)), np.asarray(b.column(c)), equal_nan=True)
    ta, tb = np.asarray(a.column("pipeline_time")), np.asarray(b.column("pipeline_time"))
    assert tb[-1] > ta[-1]


@pytest.mark.parametrize("opt", ["gd", "agd", "pprs"])
def test_side_by_side_points_equal_the_points_run_one_by_one(opt, tmp_path, monkeypatch):
    """``depth_runs.run_side_by_side`` (``runner.run_together``): the reduced points of a
    group, iteration by iteration, write what each run alone writes (every column but the
    wall time, bitwise), and each call is computed once for the whole group."""
    from hpcpipe.run.results import load
    from hpcpipe.studies import depth_runs

    depths = (2, 16, 64)
    items = {
        mode: [
            (f"{opt}-D{D}", _values(opt, D, "reduced"), str(tmp_path / mode / f"D{D}.h5"))
            for D in depths
        ]
        for mode in ("alone", "beside")
    }
    calls = {"n": 0}
    inner = simulated.SimulatedPipeline.evaluate

    def counting(self, *a, **k):
        calls["n"] += 1
        return inner(self, *a, **k)

    monkeypatch.setattr(simulated.SimulatedPipeline, "evaluate", counting)
    counts = {}
    for mode in ("alone", "beside"):
        reduced.clear_memo()
        (tmp_path / mode).mkdir()
        calls["n"] = 0
        if mode == "alone":
            got = [depth_runs.run_point(item) for item in items[mode]]
            reduced.clear_memo()
            calls["n"] = 0
            label, values, _ = items[mode][0]
            depth_runs.run_point((label, values, str(tmp_path / "one.h5")))  # one run's calls
        else:
            got = depth_runs.run_side_by_side(items[mode])
        counts[mode] = calls["n"]
        items[mode] = (got, [load(p) for _, _, p in items[mode]])
    (alone, fa), (beside, fb) = items["alone"], items["beside"]
    assert counts["beside"] == counts["alone"]  # the deeper points computed nothing
    for a, b, ra, rb in zip(alone, beside, fa, fb):
        assert a["label"] == b["label"] and a["iterations"] == b["iterations"]
        assert a["time"] == b["time"] or (math.isnan(a["time"]) and math.isnan(b["time"]))
        assert ra.status == rb.status
        for c in ("iteration", "loss", "f", "gap", "pipeline_time"):
            np.testing.assert_array_equal(ra.iterations[c], rb.iterations[c], err_msg=c)
    times = [r.iterations["pipeline_time"][-1] for r in fb]
    assert times[0] < times[1] < times[2]  # each timed at its own depth
