"""Optimizers on the convex chains and the attack, run on one rank (COMM_SELF)."""

import math

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.model.reference import Reference
from hpcpipe.model.stages import Batch
from hpcpipe.optim.methods import theory_plan
from hpcpipe.problems.chains import l1_chain, max_chain, quad_chain
from hpcpipe.problems.digits import attack, load_digits_split, logits
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run

SELF = MPI.COMM_SELF


def test_problems_know_their_optimum():
    for prob in (l1_chain(3, 8, 1), max_chain(3, 8, 1), quad_chain(3, 8, 1)):
        ref = Reference(prob.spec, prob.batch, "input")
        ts = prob.theta_star
        reg = prob.regulariser.value if prob.regulariser else (lambda p: 0.0)
        f = ref.loss(ts) + reg(ts)
        assert math.isclose(f, prob.f_star, abs_tol=1e-12)
        assert math.isclose(np.linalg.norm(ts), prob.R, rel_tol=1e-12)
        # and it is a minimum: random nearby points are not better
        g = np.random.default_rng(0)
        for _ in range(20):
            p = ts + 1e-3 * g.standard_normal(ts.size)
            assert ref.loss(p) + reg(p) >= f - 1e-12


def test_pprs_gradient_is_unbiased_for_smoothed_gradient():
    """Mean of the K-sample estimate over many calls == FD gradient of Monte-Carlo f_γ.

    Both sides use the same noise draws (common random numbers), so the only
    error left in the finite difference is O(h²); the statistical part is
    checked against the standard error of the mean over calls.
    """
    prob = l1_chain(3, 6, 2)
    ref = Reference(prob.spec, prob.batch, "input", seed=4)
    theta = np.random.default_rng(1).standard_normal(6) * 0.3
    gamma, K, calls = 0.2, 8, 400
    grads = np.array([ref.loss_and_grad(theta, gamma, c, K)[1] for c in range(calls)])
    mean = grads.mean(0)
    se = grads.std(0, ddof=1) / math.sqrt(calls)
    h = 1e-5
    fd = np.zeros(6)
    for i in range(6):
        e = np.zeros(6)
        e[i] = h
        fp = np.mean([ref.loss(theta + e, gamma, c, K) for c in range(calls)])
        fm = np.mean([ref.loss(theta - e, gamma, c, K) for c in range(calls)])
        fd[i] = (fp - fm) / (2 * h)
    assert np.all(np.abs(mean - fd) <= 1e-6 + 1e-6 * np.abs(fd))  # same draws: exact up to FD
    # independent draws: the estimate from other calls agrees within 4 standard errors
    other = np.array([ref.loss_and_grad(theta, gamma, c, K)[1] for c in range(calls, 2 * calls)])
    assert np.all(np.abs(other.mean(0) - fd) <= 4 * np.sqrt(se**2 + (other.std(0) / 20) ** 2))
    assert np.all(se > 0)


def _slope(ts, gaps):
    return float(np.polyfit(np.log(ts), np.log(gaps), 1)[0])


def test_quad_chain_rates_agd_1_over_t2_gd_1_over_t():
    ts = np.array([8, 16, 32, 64, 128])
    cfg = dict(problem="quad-chain", depth=2, dim=1024, schedule="gpipe", progress="off")
    out = {}
    for opt in ("agd", "gd"):
        res = run(make_config({**cfg, "optimizer": opt, "lr": 1.0, "iterations": 128}), SELF)
        gaps = res.column("gap")[ts - 1]
        assert np.all(gaps > 0)
        out[opt] = _slope(ts, gaps)
    assert -2.3 <= out["agd"] <= -1.7, out
    assert -1.3 <= out["gd"] <= -0.7, out


@pytest.mark.parametrize("problem", ["l1-chain", "max-chain"])
@pytest.mark.parametrize("optimizer", ["gd", "agd", "pprs"])
def test_theory_parameters_reach_epsilon(problem, optimizer):
    # below each problem's initial gap f(0) - f* (l1-chain ~0.8; max-chain 1/(2√d) = 0.125)
    eps = {"l1-chain": 0.25, "max-chain": 0.05}[problem]
    cfg = make_config(
        dict(
            problem=problem,
            depth=3,
            dim=16,
            mode="theory",
            epsilon=eps,
            optimizer=optimizer,
            progress="off",
            seed=3,
        )
    )
    res = run(cfg, SELF)
    assert res.status == "complete"
    assert res.info["initial_gap"] > 2 * eps  # θ₀ is far from ε: reaching it means something
    best_gap = float(np.nanmin(res.column("gap")))
    assert best_gap <= eps, f"{optimizer} on {problem}: best f - f* = {best_gap:.4f} > {eps}"


def test_theory_plan_pprs_depth_term_scales_with_d_quarter():
    p16 = theory_plan("pprs", 0.1, 1.0, 1.0, 16)
    p256 = theory_plan("pprs", 0.1, 1.0, 1.0, 256)
    assert math.isclose(p256.iterations / p16.iterations, 2.0, rel_tol=0.02)  # (256/16)^(1/4)
    assert p16.method.samples >= 1 and p16.method.gamma > 0


def test_attack_stays_in_box_and_fools_classifier():
    prob = attack(SELF, 4, 32, 5, 0, radius=0.1)
    assert prob.info["classifier_test_accuracy"] >= 0.90
    seen = []

    cfg = make_config(
        dict(
            problem="attack",
            depth=4,
            width=32,
            m=5,
            radius=0.1,
            optimizer="pprs",
            samples=4,
            gamma=0.01,
            lr=0.05,
            iterations=30,
            progress="off",
        )
    )
    res = run(cfg, SELF, problem=prob, on_iteration=seen.append)
    delta = res.theta
    lo, hi = prob.box
    assert np.all(delta >= lo - 1e-15) and np.all(delta <= hi + 1e-15)
    assert np.abs(delta).max() <= 0.1 + 1e-15
    x = prob.batch.x + delta.reshape(prob.batch.x.shape)
    assert x.min() >= 0 and x.max() <= 1
    acc_clean = float(
        (logits(prob.spec, prob.weights, prob.batch.x).argmax(1) == prob.batch.targets).mean()
    )
    acc_adv = float((logits(prob.spec, prob.weights, x).argmax(1) == prob.batch.targets).mean())
    assert acc_clean == 1.0 and acc_adv < acc_clean
    assert math.isclose(res.info["attack_success"], 1 - acc_adv)
    assert len(seen) == len(res.table)


def test_divergence_is_a_status_not_a_crash():
    cfg = make_config(
        dict(
            problem="quad-chain",
            depth=2,
            dim=32,
            optimizer="gd",
            lr=10.0,
            iterations=200,
            progress="off",
        )
    )
    res = run(cfg, SELF)
    assert res.status == "diverged"
    assert len(res.table) < 200


def test_fewshot_training_reduces_loss():
    cfg = make_config(
        dict(
            problem="fewshot",
            depth=3,
            width=16,
            m=10,
            optimizer="agd",
            lr=0.1,
            momentum="0.9",
            iterations=40,
            progress="off",
        )
    )
    res = run(cfg, SELF)
    f = res.column("f")
    assert f[-1] < 0.5 * f[0]
    xtr, ytr, _, _ = load_digits_split(0)
    assert Batch(xtr[:10], ytr[:10]).m == 10
