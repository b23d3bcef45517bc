"""Hard instances (f*, L, R against scipy), GD's exponent, AC-SA's bound and the final iterate."""

import dataclasses
import math

import numpy as np
import pytest
from mpi4py import MPI
from scipy.optimize import linprog, minimize, minimize_scalar

from hpcpipe.model.reference import Reference
from hpcpipe.optim.acsa import acsa_plan, acsa_terms
from hpcpipe.optim.methods import PPRS, theory_plan
from hpcpipe.problems import PROBLEMS
from hpcpipe.problems.chains import chain_map
from hpcpipe.problems.worstcase import (
    hard_chain_length,
    nesterov_chain,
    pinball_chain,
    pinball_first_possible,
    pinball_smoothed,
    pinball_smoothing_gap,
    pinball_smoothing_shift,
    pinball_speed_limit,
)
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run
from hpcpipe.studies.hardness import (
    exact_f,
    exponent_rows,
    family,
    final_gaps,
    fit_exponent,
    gd_iterations,
    mean_se,
    pprs_plan,
    serial_run,
)


def _mu(prob):
    return prob.regulariser.mu if prob.regulariser is not None else 0.0


def _f(prob):
    ref = Reference(prob.spec, prob.batch, "input")
    return ref, (lambda th: exact_f(prob, ref, th))


def _lipschitz_ok(prob, ref, radius, n=200):
    g = np.random.default_rng(0)
    for _ in range(n):
        th = g.standard_normal(prob.dim)
        th *= radius * g.uniform() / np.linalg.norm(th)
        grad = ref.loss_and_grad(th)[1] + _mu(prob) * th
        assert np.linalg.norm(grad) <= prob.L * (1 + 1e-12)


def test_nesterov_chain_optimum_against_scipy():
    prob = nesterov_chain(2, 7, 3, k=5)
    ref, f = _f(prob)
    q = chain_map(prob.spec)
    # epigraph form: min s + (μ/2)‖θ‖² subject to s >= (θQ)_j, j < k (SLSQP, independent of us)
    k, d = 5, 7
    cons = [{"type": "ineq", "fun": (lambda v, j=j: v[d] - v[:d] @ q[:, j])} for j in range(k)]
    res = minimize(
        lambda v: v[d] + 0.5 * _mu(prob) * v[:d] @ v[:d],
        np.zeros(d + 1),
        constraints=cons,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    assert res.success
    assert math.isclose(res.fun, prob.f_star, abs_tol=1e-9)
    assert math.isclose(prob.f_star, -1 / (2 * math.sqrt(k)), rel_tol=1e-14)
    np.testing.assert_allclose(res.x[:d], prob.theta_star, atol=1e-6)
    assert math.isclose(f(prob.theta_star), prob.f_star, abs_tol=1e-12)
    assert math.isclose(np.linalg.norm(prob.theta_star), prob.R, rel_tol=1e-12)
    _lipschitz_ok(prob, ref, 2 * prob.R)


def test_nesterov_chain_resists_every_step_size_for_k_iterations():
    """The lower bound on measured runs: f(θ_t) − f* >= 1/(2√k) for t < k, whatever η."""
    k = 12
    prob = nesterov_chain(3, k, 1)
    ref, f = _f(prob)
    for eta in (1e-3, 1e-2, 0.1, 1.0):
        theta = np.zeros(k)
        for _ in range(k - 1):
            theta = theta - eta * (ref.loss_and_grad(theta)[1] + _mu(prob) * theta)
            assert f(theta) - prob.f_star >= 1 / (2 * math.sqrt(k)) - 1e-12
    assert hard_chain_length(1 / 64) == 256 and hard_chain_length(0.25) == 1
    with pytest.raises(ValueError, match="1 <= k <= d"):
        nesterov_chain(1, 4, 0, k=5)


def test_pinball_chain_optimum_against_linprog():
    prob = pinball_chain(2, 6, 4)
    ref, f = _f(prob)
    d, tau = 6, prob.info["tau"]
    q, b = chain_map(prob.spec), prob.batch.targets.ravel()
    s = 1 / (max(tau, 1 - tau) * math.sqrt(d))
    # variables θ (free), u, v >= 0 with Qᵀθ − u + v = b: min s·(τΣu + (1 − τ)Σv)
    c = np.concatenate([np.zeros(d), s * tau * np.ones(d), s * (1 - tau) * np.ones(d)])
    a_eq = np.hstack([q.T, -np.eye(d), np.eye(d)])
    bounds = [(None, None)] * d + [(0, None)] * (2 * d)
    res = linprog(c, A_eq=a_eq, b_eq=b, bounds=bounds, method="highs")
    assert res.status == 0
    assert math.isclose(res.fun, prob.f_star, abs_tol=1e-10)
    np.testing.assert_allclose(res.x[:d], prob.theta_star, atol=1e-8)
    assert math.isclose(f(prob.theta_star), 0.0, abs_tol=1e-14)
    assert math.isclose(np.linalg.norm(prob.theta_star), prob.R, rel_tol=1e-12)
    assert math.isclose(prob.L, 1.0, rel_tol=1e-12)
    _lipschitz_ok(prob, ref, 10.0)
    # L is attained: all residuals of one sign give a subgradient of norm τ·s·√d = 1
    far = prob.theta_star + 5.0 * np.ones(d) @ q.T
    assert math.isclose(np.linalg.norm(ref.loss_and_grad(far)[1]), 1.0, rel_tol=1e-12)


def test_pinball_smoothing_is_biased_as_derived():
    prob = pinball_chain(2, 8, 5)
    gamma, tau, d = 0.3, prob.info["tau"], 8
    # the closed form of E ρ_τ(r + γW) against the pipeline's own smoothing (Monte Carlo)
    ref = Reference(prob.spec, prob.batch, "input", seed=11)
    th = 0.2 * np.random.default_rng(2).standard_normal(d)
    r = (th @ chain_map(prob.spec) - prob.batch.targets).ravel()
    closed = pinball_smoothed(r, gamma, tau).sum() / (max(tau, 1 - tau) * math.sqrt(d))
    draws = ref.loss_and_grad(th, gamma, call=0, samples=4000)[0]
    se = draws.std(ddof=1) / math.sqrt(draws.size)
    assert abs(draws.mean() - closed) < 4 * se
    # its minimiser (scipy, on the closed form) is shifted by γΦ⁻¹(1 − τ), not 0
    res = minimize_scalar(
        lambda x: pinball_smoothed(x, gamma, tau),
        bounds=(-2, 2),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert math.isclose(res.x, pinball_smoothing_shift(gamma, tau), abs_tol=1e-6)
    assert pinball_smoothing_shift(gamma, tau) < -0.2  # a real bias
    # and f at θ_γ* = (b + γq1)Qᵀ is the derived floor, a fixed fraction of γL√d
    ts = (prob.batch.targets + pinball_smoothing_shift(gamma, tau)) @ chain_map(prob.spec).T
    floor = exact_f(prob, ref, ts.ravel()) - prob.f_star
    assert math.isclose(floor, pinball_smoothing_gap(d, gamma, tau), rel_tol=1e-12)
    assert math.isclose(floor / (gamma * math.sqrt(d)), 0.22483, rel_tol=1e-4)


def test_gd_exponent_is_two_on_nesterov_chain_and_not_on_l1_chain():
    xs = (24, 32, 48)
    for name, lo, hi in (("nesterov-chain", 1.8, 2.2), ("l1-chain", 0.7, 1.4)):
        rows = exponent_rows(name, xs)
        assert all(r[4] is not None for r in rows), rows
        p, _, _ = fit_exponent(xs, [r[4] for r in rows])
        assert lo <= p <= hi, (name, p, rows)
        near_two = 1.8 <= p <= 2.2
        assert near_two == (name == "nesterov-chain")  # the check would fail on l1-chain
    # GD is above the lower bound k (any step) and within its plan T
    prob, eps = family("nesterov-chain", 32)
    for scale in (0.25, 1.0, 4.0):
        n, T = gd_iterations(prob, eps, limit=4096, step_scale=scale)
        assert n is None or n >= prob.dim, (scale, n)
    n, T = gd_iterations(prob, eps)
    assert prob.dim <= n <= T


def test_fit_exponent_interval():
    xs = np.array([10.0, 20, 40, 80])
    p, lo, hi = fit_exponent(xs, 3 * xs**2 * np.array([1.0, 1.1, 0.95, 1.02]))
    assert lo < 2 < hi and abs(p - 2) < 0.1


def test_acsa_plan_bound_is_below_eps_and_k_is_the_smallest():
    for eps, L, R, d in ((0.5, 1.0, 1.0, 16), (0.1, 1.5, 2.0, 64), (0.02, 1.0, 1.0, 4096)):
        p = acsa_plan(eps, L, R, d)
        assert p.bound <= eps
        assert p.eta <= p.gamma / (4 * L) * (1 + 1e-15)
        assert p.optimisation + p.bias <= 4 * L * R**2 / (p.gamma * p.iterations**2) + p.bias
        a = R * L * math.sqrt((2 * p.iterations + 1) / (3 * p.iterations * (p.iterations + 1)))
        assert 2 * a / math.sqrt(p.samples) <= eps / 2 * (1 + 1e-12)
        if p.samples > 1:
            assert 2 * a / math.sqrt(p.samples - 1) > eps / 2
    with pytest.raises(ValueError, match="eta <= gamma/"):
        acsa_terms(1.0, 1.0, 4, 0.1, 1, 10, 0.1)
    method, T, guarantee = pprs_plan(0.1, 1.0, 1.0, 16)
    assert method.momentum == "acsa" and T == acsa_plan(0.1, 1.0, 1.0, 16).iterations


def test_acsa_state_is_nesterov_momentum_with_growing_step_when_unconstrained():
    """x̄_{t+1} = y_t − (2tη/(t+1))g_t and y_{t+1} = x̄_{t+1} + ((t−1)/(t+2))(x̄_{t+1} − x̄_t)."""
    g, same = np.random.default_rng(3), (lambda v: v)
    eta, opt = 0.1, PPRS(0.1, 0.01, 2, momentum="acsa")
    st = opt.init(np.zeros(4), same)
    prev_bar = st["theta"].copy()
    for t in range(1, 8):
        y = opt.point(st, same)
        if t > 1:
            np.testing.assert_allclose(
                y, st["theta"] + (t - 2) / (t + 1) * (st["theta"] - prev_bar)
            )
        grad = g.standard_normal(4)
        prev_bar = st["theta"].copy()
        st = opt.update(st, y, grad, same)
        assert st["t"] == t + 1
        np.testing.assert_allclose(st["theta"], y - 2 * t * eta / (t + 1) * grad, atol=1e-15)


def test_acsa_theorem_holds_on_a_noisy_quadratic():
    """F = (β/2)‖x − c‖², G = ∇F + σ-noise: mean final gap <= the theorem's bound."""
    d, beta, sigma, T = 5, 4.0, 0.5, 40
    c = np.full(d, 1 / math.sqrt(d))  # R = ‖θ₀ − x*‖ = 1
    for eta in (1 / (4 * beta), 0.01):
        gaps = []
        for s in range(200):
            g = np.random.default_rng(s)
            opt, same = PPRS(eta, 0.0, 1, momentum="acsa"), (lambda v: v)
            st = opt.init(np.zeros(d), same)
            for _ in range(T):
                y = opt.point(st, same)
                noisy = beta * (y - c) + sigma / math.sqrt(d) * g.standard_normal(d)
                st = opt.update(st, y, noisy, same)
            gaps.append(0.5 * beta * np.sum((st["theta"] - c) ** 2))
        bound = 1 / (eta * T * (T + 1)) + eta * sigma**2 * (2 * T + 1) / 3
        assert np.mean(gaps) <= bound, (eta, np.mean(gaps), bound)
    # the cap is not vacuous: 16x above it (η = 4/β) the same method diverges
    opt, same = PPRS(4 / beta, 0.0, 1, momentum="acsa"), (lambda v: v)
    st = opt.init(np.zeros(d), same)
    for _ in range(T):
        y = opt.point(st, same)
        st = opt.update(st, y, beta * (y - c), same)
    assert 0.5 * beta * np.sum((st["theta"] - c) ** 2) > 1.0


def test_run_loop_equals_serial_reference_run():
    """What ``run`` executes in theory mode (engine, AC-SA, regulariser) == ``serial_run``."""
    cfg = make_config(
        dict(
            problem="nesterov-chain",
            depth=3,
            dim=8,
            mode="theory",
            epsilon=0.1,
            optimizer="pprs",
            progress="off",
            seed=2,
        )
    )
    res = run(cfg, MPI.COMM_SELF)
    prob = nesterov_chain(3, 8, 2)
    plan = theory_plan("pprs", 0.1, prob.L, prob.R, prob.dim)
    assert plan.method.momentum == "acsa" and "final iterate" in plan.guarantee
    theta = serial_run(prob, plan.method, plan.iterations, 2)
    np.testing.assert_allclose(res.theta, theta, rtol=0, atol=1e-12)
    assert set(PROBLEMS.names()) >= {"nesterov-chain", "pinball-chain"}


def test_pprs_final_iterate_over_seeds_and_planted_faults_fail():
    """E f(θ_T) − f* <= ε at the final iterate (mean over 10 seeds), on the biased instance;
    γ × 30 (bias floor 0.42 > ε predicted) and no momentum make the same check fail."""
    eps, seeds = 0.25, range(10)
    gaps, info = final_gaps("pinball-chain", eps, 16, seeds)
    m, se = mean_se(gaps)
    assert m + 3 * se <= eps, (m, se, info)
    assert pinball_smoothing_gap(16, 30 * info["gamma"]) > eps
    for fault in ("gamma x 30", "no momentum"):
        bad, _ = final_gaps("pinball-chain", eps, 16, seeds, fault)
        assert mean_se(bad)[0] > eps, fault


def test_speed_limit_holds_along_runs_and_its_first_step_is_exact():
    """f(θ_t) − f* >= pinball_speed_limit(b, η, t) at every iterate of AC-SA runs with and
    without smoothing; pinball_first_possible is the first t where the bound allows ε."""
    prob = pinball_chain(2, 16, 3)
    method, T, _ = pprs_plan(0.25, prob.L, prob.R, prob.dim)
    b = prob.batch.targets
    ref = Reference(prob.spec, prob.batch, "input", seed=3)
    for m in (method, dataclasses.replace(method, gamma=0.0, samples=1)):
        state = m.init(ref.initial_point(), prob.project)
        for t in range(1, T + 1):
            y = m.point(state, prob.project)
            _, g = ref.loss_and_grad(y, m.gamma, t, m.samples)
            state = m.update(state, y, g, prob.project)
            assert exact_f(prob, ref, state["theta"]) >= pinball_speed_limit(b, m.lr, t) - 1e-12
    for eps in (0.05, 0.25):
        n = pinball_first_possible(b, method.lr, eps)
        assert (
            pinball_speed_limit(b, method.lr, n) <= eps < pinball_speed_limit(b, method.lr, n - 1)
        )
    # the limit alone moves as eta^(-1/2): a step 4x larger halves it (to rounding)
    n1, n4 = (pinball_first_possible(b, c * method.lr, 0.05) for c in (1, 4))
    assert abs(n4 - n1 / 2) <= 1
