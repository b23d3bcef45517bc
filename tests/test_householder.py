"""O(d) orthogonal layers (``layers = "householder"``): orthogonal, mixing, fused = layered,
the lower-bound instance keeps its span property, settings, results and memory estimate."""

import math

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.cli.main import main
from hpcpipe.model.layers import REFLECTORS, Householder, backward_layers, forward_layers
from hpcpipe.model.reflectors import ReflectorChain, clear_reflector_chains, reflector_chain
from hpcpipe.model.rng import init_generator
from hpcpipe.model.stages import ModelSpec, build_stages, random_batch
from hpcpipe.pipeline.simulated import SimulatedPipeline
from hpcpipe.problems.chains import chain_map, with_layers
from hpcpipe.problems.worstcase import nesterov_chain
from hpcpipe.run.config import make_config
from hpcpipe.run.resources import LIMIT_ENV, estimate
from hpcpipe.run.results import load
from hpcpipe.run.runner import make_problem, run


def _chain(depth: int, d: int, seed: int = 3, head: str = "abs") -> ModelSpec:
    return ModelSpec("householder", depth=depth, d_in=d, d_out=d, head=head, seed=seed)


def _layered(spec: ModelSpec, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(xQ, xQQᵀ) through the layers one by one."""
    layers = build_stages(spec, 1)[0].layers
    none = [[]] * len(layers)
    y, caches = forward_layers(layers, x, none)
    return y, backward_layers(layers, y, caches, none, None)


def test_a_layer_is_orthogonal_and_costs_o_of_d():
    layer = Householder.init(np.random.default_rng(1), 257)
    assert layer.u.shape == (REFLECTORS, 257) and layer.params() == []
    q = layer.matrix()
    np.testing.assert_allclose(q.T @ q, np.eye(257), rtol=0, atol=1e-13)
    assert np.linalg.slogdet(q)[0] == 1.0  # two reflectors: a rotation
    x = np.random.default_rng(2).standard_normal((4, 257))
    y, _ = layer.forward(x, [])
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13)
    # backward is the transpose: <xQ, v> = <x, vQᵀ>
    v = np.random.default_rng(3).standard_normal((4, 257))
    assert np.sum(y * v) == pytest.approx(np.sum(x * layer.backward(v, None, [], None)), rel=1e-13)


def test_a_layer_mixes_every_coordinate():
    """Every off-diagonal entry of one layer's Q is non-zero: each output coordinate
    depends on each input coordinate (a signed permutation would fail this)."""
    for seed in range(5):
        q = Householder.init(init_generator(seed, 0), 64).matrix()
        off = q[~np.eye(64, dtype=bool)]
        assert np.abs(off).min() > 1e-8, seed


@pytest.mark.parametrize(("d", "depth"), [(6, 64), (16, 33), (300, 100), (1024, 40)])
def test_norm_kept_through_a_deep_chain_and_wy_equals_layered(d, depth):
    spec = _chain(depth, d)
    x = np.random.default_rng(0).standard_normal((3, d))
    y, back = _layered(spec, x)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13)
    np.testing.assert_allclose(back, x, rtol=0, atol=1e-13)
    chain = ReflectorChain(3, d, depth)
    np.testing.assert_allclose(chain.forward(x, depth), y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(chain.backward(y, depth), x, rtol=0, atol=1e-12)
    # O(Δd) memory: the stacked vectors and the panels' T, never d x d
    assert chain.nbytes <= 8 * REFLECTORS * depth * (d + 64)
    # a shorter chain is a prefix (a partial last panel included)
    short = depth // 2 + 1
    np.testing.assert_allclose(
        chain.forward(x, short), _layered(_chain(short, d), x)[0], rtol=0, atol=1e-12
    )


def test_the_kept_chain_extends_to_deeper_chains():
    clear_reflector_chains()
    a = reflector_chain(5, 32, 10)
    b = reflector_chain(5, 32, 90)
    assert a is b and b.depth == 90
    x = np.random.default_rng(1).standard_normal((2, 32))
    np.testing.assert_allclose(b.forward(x, 90), _layered(_chain(90, 32, 5), x)[0], atol=1e-12)
    clear_reflector_chains()


def test_simulated_fused_equals_layered():
    spec = _chain(48, 20, seed=4)
    batch = random_batch(spec, 3, seed=1)
    kw = dict(samples=5, microbatches=3, seed=7, stages=8)
    fused = SimulatedPipeline(spec, batch, "input", "gpipe", fused="on", **kw)
    layered = SimulatedPipeline(spec, batch, "input", "gpipe", fused="off", **kw)
    assert fused.fused and fused.model is None and not layered.fused
    p = np.random.default_rng(0).standard_normal(fused.local_size)
    a, b = fused.evaluate(p, 0.3, call=2), layered.evaluate(p, 0.3, call=2)
    np.testing.assert_allclose(a.grad, b.grad, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.item_losses, b.item_losses, rtol=0, atol=1e-12)
    assert a.time == b.time


@pytest.mark.parametrize("layers", ["householder", "dense"])
def test_nesterov_chain_keeps_its_span_lower_bound(layers):
    """The lower bound of ``worstcase.nesterov_chain`` with either layer type: subgradient
    steps from θ₀ = 0 touch one new coordinate of z = θQ per oracle call, so after t < k
    calls z has at most t non-zero coordinates and f(θ_t) − f* ≥ 1/(2√k)."""
    k, d, depth = 12, 16, 7
    prob = with_layers(nesterov_chain(depth, d, seed=2, k=k), layers)
    assert prob.spec.kind == {"householder": "householder", "dense": "orthogonal"}[layers]
    q = chain_map(prob.spec)
    np.testing.assert_allclose(q.T @ q, np.eye(d), rtol=0, atol=1e-13)
    sim = SimulatedPipeline(prob.spec, prob.batch, "input", samples=1, seed=0)
    theta = sim.initial_point()
    for t in range(1, k):
        r = sim.evaluate(theta)
        theta = theta - 0.05 * (r.grad + prob.regulariser.grad(theta))
        z = theta @ q
        assert np.count_nonzero(np.abs(z) > 1e-12) <= t
        assert np.all(z[k:] == pytest.approx(0, abs=1e-12))
        f = np.max(z[:k]) + prob.regulariser.value(theta)
        assert f - prob.f_star >= 1 / (2 * math.sqrt(k)) - 1e-12
    # k calls can reach every coordinate of the chain: the bound is tight in t
    r = sim.evaluate(theta)
    theta = theta - 0.05 * (r.grad + prob.regulariser.grad(theta))
    assert np.count_nonzero(np.abs(theta @ q) > 1e-12) == k


def test_problem_constants_do_not_depend_on_the_layer_type():
    for layers in ("dense", "householder"):
        cfg = make_config(dict(problem="nesterov-chain", depth=5, dim=9, layers=layers))
        prob = make_problem(cfg, MPI.COMM_SELF)
        assert (prob.L, prob.R, prob.f_star) == (1 + 2 / 3, 1.0, -1 / 6)
        theta = prob.theta_star
        assert np.linalg.norm(theta) == pytest.approx(1.0, rel=1e-13)
        assert np.max((theta @ chain_map(prob.spec))[:9]) == pytest.approx(-1 / 3, rel=1e-12)


def test_result_records_the_layer_type(tmp_path):
    out = tmp_path / "h.h5"
    cfg = make_config(
        dict(
            problem="max-chain",
            layers="householder",
            depth=64,
            dim=8,
            executor="simulated",
            optimizer="pprs",
            samples=3,
            gamma=0.1,
            iterations=5,
            progress="off",
            output=str(out),
        )
    )
    res = run(cfg, MPI.COMM_SELF)
    r = load(out)
    assert r.status == "complete" and r.config["layers"] == "householder"
    assert np.all(np.diff(res.column("loss")) != 0)  # it optimised something


def test_memory_estimate_follows_the_layer_type(monkeypatch, capsys):
    base = dict(problem="nesterov-chain", depth=4096, dim=1024, samples=1)  # K = 1
    dense = estimate(make_config({**base, "executor": "simulated"}))["layers"][0]
    house = estimate(make_config({**base, "executor": "simulated", "layers": "householder"}))
    assert house["layers"][0] == 8 * 2 * 4096 * (1024 + 64)  # 68 MiB
    assert dense == 4 * 8 * 1024**2 + 8 * 1024**2 * 13  # composed d x d and its prefixes
    monkeypatch.setenv(LIMIT_ENV, "4G")
    # the MPI engine builds every dense layer: Δ·20·d² = 80 GiB, refused with the fix
    rc = main(["validate", *(f"--{k}={v}" for k, v in base.items())])
    text = capsys.readouterr()
    text = text.out + text.err
    assert rc == 2 and len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert "depth = 4096, dim = 1024: the run needs about 80.2 GiB of memory" in text
    assert "or set layers = householder (O(d) per layer)" in text
    assert main(["validate", *(f"--{k}={v}" for k, v in base.items()), "--layers=householder"]) == 0


def test_householder_is_for_the_chains(capsys):
    rc = main(["validate", "--problem=fewshot", "--m=4", "--layers=householder"])
    text = capsys.readouterr().err
    assert rc == 2 and "layers = 'householder' is not allowed" in text
    assert "fewshot trains a ReLU MLP" in text


def _driver(module: str, args: list[str], limit: str, tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, **{LIMIT_ENV: limit})
    cmd = [sys.executable, "-m", f"hpcpipe.studies.{module}", "--out", str(tmp_path / "R"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_study_drivers_refuse_a_too_large_study_in_one_line(tmp_path):
    """Before any work: exit 2, one line naming the memory and the fix, nothing written."""
    args = ["--xs", "128", "--depths", "2,4096", "--layers", "dense"]  # auto: householder
    p = _driver("depth_runs", args, "300M", tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "depth = 4096, dim = 1024: 2 workers need about" in lines[0]
    assert "use fewer --workers, smaller sizes or --layers householder" in lines[0]
    assert not (tmp_path / "R").exists()
    p = _driver("dimension_runs", ["--dims", "16,64"], "1M", tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "the run needs about" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "R").exists()


def test_the_householder_depth_study_fits_where_the_dense_one_is_refused(monkeypatch):
    from hpcpipe.errors import ConfigError
    from hpcpipe.studies.depth_runs import DepthPlan, all_points, check_points

    monkeypatch.setenv(LIMIT_ENV, "4G")
    plan = DepthPlan(xs=(128.0,), depths=(2, 4096), layers="householder", extra={})
    points = all_points(plan)
    assert {v["layers"] for v in points} == {"householder"}
    assert {v["dim"] for v in points} == {1024}
    check_points(points, workers=2)
    monkeypatch.setenv(LIMIT_ENV, "200M")
    with pytest.raises(ConfigError, match="use fewer --workers, smaller sizes"):
        check_points(points, workers=2)


def test_bench_study_measures_the_o_of_d_layers(capsys):
    from hpcpipe.bench.study import bench_study

    assert bench_study([4], 4, 2, 1, householder=(64, 32)) == 0
    out = capsys.readouterr().out
    assert "O(d) layers" in out and "later calls (ms)" in out and "chain (MiB)" in out
    assert "sanity: ok" in out
