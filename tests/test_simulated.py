"""The simulated pipeline: same numbers as the reference, fused = layered, timing cached."""

import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.model.reference import Reference
from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline import simulated
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.simulated import SimulatedPipeline
from hpcpipe.pipeline.simulator import closed_form
from hpcpipe.problems.chains import chain_map
from hpcpipe.run.config import ConfigError, make_config, validate
from hpcpipe.run.results import load
from hpcpipe.run.runner import run


def test_fused_chain_equals_layered():
    spec = ModelSpec("orthogonal", depth=64, d_in=16, d_out=16, head="abs", seed=4)
    batch = random_batch(spec, 3, seed=1)
    kw = dict(samples=5, microbatches=3, seed=7, stages=8)
    fused = SimulatedPipeline(spec, batch, "input", "gpipe", fused="on", **kw)
    layered = SimulatedPipeline(spec, batch, "input", "gpipe", fused="off", **kw)
    assert fused.fused and not layered.fused
    p = np.random.default_rng(0).standard_normal(fused.local_size)
    a, b = fused.evaluate(p, 0.3, call=2), layered.evaluate(p, 0.3, call=2)
    np.testing.assert_allclose(a.grad, b.grad, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.item_losses, b.item_losses, rtol=0, atol=1e-12)
    assert a.time == b.time


def test_chain_prefixes_equal_the_layered_product():
    simulated.clear_chains()
    spec = {
        D: ModelSpec("orthogonal", depth=D, d_in=6, d_out=6, head="max", seed=3) for D in (3, 8, 11)
    }
    first = {D: simulated.builtin_chain_matrix(spec[D]) for D in (8, 3, 11)}  # 3, 11: prefixes
    for D, q in first.items():
        np.testing.assert_allclose(q, chain_map(spec[D]), rtol=0, atol=1e-13)
        np.testing.assert_allclose(q @ q.T, np.eye(6), rtol=0, atol=1e-13)
    simulated.clear_chains()
    for D in (11, 3):  # built from scratch: the same floats as from a kept prefix
        assert np.array_equal(simulated.builtin_chain_matrix(spec[D]), first[D])
    assert simulated.builtin_chain_matrix(spec[11]) is simulated.builtin_chain_matrix(spec[11])
    assert not first[11].flags.writeable


@pytest.mark.parametrize(
    "variable,kind,head", [("weights", "mlp", "cross_entropy"), ("input", "orthogonal", "squared")]
)
def test_simulated_equals_reference(variable, kind, head):
    spec = ModelSpec(kind, depth=3, d_in=5, d_out=5, width=4, head=head, seed=2)
    batch = random_batch(spec, 4, seed=3)
    sim = SimulatedPipeline(spec, batch, variable, "1f1b", samples=3, microbatches=2, seed=5)
    ref = Reference(spec, batch, variable, seed=5)
    p = sim.initial_point() + 0.05
    for reduce in ("mean", "sum"):
        res = sim.evaluate(p, 0.2, call=3, reduce=reduce)
        losses, grad = ref.loss_and_grad(p, 0.2, 3, samples=3, reduce=reduce)
        np.testing.assert_allclose(res.grad, grad, rtol=0, atol=1e-12)
        np.testing.assert_allclose(res.losses, losses, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "variable,kind,head", [("weights", "mlp", "cross_entropy"), ("input", "orthogonal", "squared")]
)
def test_losses_without_the_gradient_are_the_same_losses(variable, kind, head, monkeypatch):
    """``evaluate(gradient=False)`` (the runner's f(θ)): the losses bitwise, no backward."""
    spec = ModelSpec(kind, depth=3, d_in=5, d_out=5, width=4, head=head, seed=2)
    batch = random_batch(spec, 4, seed=3)
    sim = SimulatedPipeline(spec, batch, variable, "gpipe", samples=3, microbatches=2, seed=5)
    p = sim.initial_point() + 0.05
    full = sim.evaluate(p, 0.2, call=3)
    backward = []
    monkeypatch.setattr(sim, "_backward", lambda *a: backward.append(1))
    only = sim.evaluate(p, 0.2, call=3, gradient=False)
    assert not backward and only.grad.size == 0
    assert np.array_equal(only.losses, full.losses)
    assert np.array_equal(only.item_losses, full.item_losses)
    assert only.time == full.time


def test_timing_simulated_once_and_equal_to_closed_form(monkeypatch):
    calls = []
    real = simulated.simulate

    def counting(*a, **k):
        calls.append(a[0].name)
        return real(*a, **k)

    monkeypatch.setattr(simulated, "simulate", counting)
    simulated.clear_timings()
    spec = ModelSpec("orthogonal", depth=12, d_in=4, d_out=4, head="squared", seed=1)
    batch = random_batch(spec, 6, seed=1)
    costs = CostModel.uniform(12, 1e-3, 2e-3, alpha=5e-5, beta=1e-8)
    times = []
    for _ in range(2):  # two executors of the same configuration share the timing
        sim = SimulatedPipeline(spec, batch, "input", "gpipe", 2, 6, costs=costs, stages=4)
        for it in range(5):
            times.append(sim.evaluate(sim.initial_point(), 0.1, call=it).time)
    assert calls == ["gpipe"]
    assert sim.timing.result is None  # no timeline asked: no per-action records
    assert sim.recorded_timing().result is not None and calls == ["gpipe", "gpipe"]
    assert sim.recorded_timing().makespan == times[0] and calls == ["gpipe"] * 2
    c = costs.message(1 * 4 * 8)  # one row of width 4 per item
    assert times[0] == pytest.approx(closed_form("gpipe", 4, 12, 3e-3, 6e-3, c), rel=1e-12)
    assert len(set(times)) == 1


def test_config_checks_of_the_stage_count():
    with pytest.raises(ConfigError, match="stages = 9 is not allowed"):
        make_config({"executor": "simulated", "depth": 8, "stages": 9})
    cfg = make_config({"executor": "simulated", "depth": 8, "stages": 4})
    with pytest.raises(ConfigError, match="runs in one process"):
        validate(cfg, 2, check_output=False)
    with pytest.raises(ConfigError, match="clock = 'model'"):
        make_config({"executor": "simulated", "clock": "wall"})
    with pytest.raises(ConfigError, match="stages are its ranks"):
        validate(make_config({"executor": "mpi", "depth": 8, "stages": 3}), 2)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcpipe",
            "run",
            "executor=simulated",
            "stages=0",
            "depth=2",
            "stages=5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "stages = 5 is not allowed" in p.stderr
    assert "Traceback" not in p.stderr


def test_result_file_records_the_executor(tmp_path):
    out = tmp_path / "sim.h5"
    cfg = make_config(
        dict(
            problem="max-chain",
            depth=16,
            dim=4,
            stages=8,
            executor="simulated",
            optimizer="pprs",
            samples=3,
            gamma=0.1,
            iterations=4,
            progress="off",
            output=str(out),
        )
    )
    res = run(cfg, MPI.COMM_SELF)
    r = load(out)
    assert r.status == "complete" and r.attrs["executor"] == "simulated"
    assert r.attrs["n_stages"] == 8 and r.attrs["n_ranks"] == 1
    per_call = closed_form("gpipe", 8, 3, 2.0, 2.0)  # 2 blocks per stage, t_F = t_B = 1
    assert res.column("pipeline_time")[-1] == pytest.approx(4 * per_call, rel=1e-12)
    busy = r.stages["busy"]
    assert busy.shape == (8,) and np.all(busy == 4 * 3 * 4.0)  # 4 calls x 3 items x (2 + 2)
    assert np.all(r.stages["actions"] == 4 * 2 * 3)
    assert set(r.timeline["stage"].tolist()) == set(range(8))  # every stage's events


def test_no_timeline_asks_for_no_per_action_records(tmp_path, monkeypatch):
    asked = []
    real = simulated.simulate

    def spy(*a, record=False, **k):
        asked.append(record)
        return real(*a, record=record, **k)

    monkeypatch.setattr(simulated, "simulate", spy)
    simulated.clear_timings()
    base = dict(
        problem="max-chain",
        depth=6,
        dim=3,
        executor="simulated",
        optimizer="pprs",
        samples=4,
        gamma=0.1,
        iterations=5,
        progress="off",
    )
    quiet = run(
        make_config(
            dict(base, output=str(tmp_path / "a.h5"), timeline_limit=0, timeline_every=100)
        ),
        MPI.COMM_SELF,
    )
    assert asked and not any(asked) and len(load(tmp_path / "a.h5").timeline["stage"]) == 0
    asked.clear()
    simulated.clear_timings()
    full = run(
        make_config(dict(base, output=str(tmp_path / "b.h5"), timeline_limit=2)), MPI.COMM_SELF
    )
    assert True in asked and len(load(tmp_path / "b.h5").timeline["stage"]) == 2 * 6 * 2 * 4
    a, b = quiet.column("pipeline_time"), full.column("pipeline_time")
    assert np.array_equal(a, b) and np.array_equal(quiet.column("loss"), full.column("loss"))
