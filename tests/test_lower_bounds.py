"""Lower bounds: tridiag-chain's constants and span bound, the smooth Θ rows and the
non-smooth lower-bound rows on nesterov-chain, with planted faults that fail them."""

import math

import numpy as np
import pytest
from mpi4py import MPI
from scipy.optimize import minimize

from hpcpipe.model.reference import Reference
from hpcpipe.problems.chains import chain_map
from hpcpipe.problems.worstcase import (
    tridiag_chain,
    tridiag_dim,
    tridiag_radius,
    tridiag_span_gap,
    tridiag_span_iterations,
)
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run
from hpcpipe.studies import lower, smooth
from hpcpipe.studies.common import load_records
from hpcpipe.studies.depth_runs import plant, practical


def _run(out, label, **values):
    base = dict(executor="simulated", schedule="gpipe", progress="off", timeline_limit=0)
    base.update(flush_every=100000)
    cfg = make_config({**base, **values, "output": str(out / f"{label}.h5")})
    return run(cfg, MPI.COMM_SELF)


def _rows(res):
    return {v.claim: v for v in res.verdicts}


def _find(rows, words):
    hits = [v for c, v in rows.items() if words in c]
    assert len(hits) == 1, (words, list(rows))
    return hits[0]


def _charge_depth_once(recs):
    """A too-good timing: the fill/drain paid once per run, not once per call."""
    for r in recs:
        it = r.it["iteration"]
        tft = r.config["t_forward"] + r.config["t_backward"]
        r.it["pipeline_time"] = (it + r.config["depth"] - 1) * tft
    return recs


# ---------------------------------------------------------------- tridiag-chain


def test_tridiag_chain_optimum_radius_and_smoothness_against_scipy():
    d, beta = 9, 2.0
    prob = tridiag_chain(3, d, 4, beta=beta)
    ref = Reference(prob.spec, prob.batch, "input")
    res = minimize(
        lambda th: ref.loss_and_grad(th)[0][0],
        np.zeros(d),
        jac=lambda th: ref.loss_and_grad(th)[1],
        method="BFGS",
        options={"gtol": 1e-12},
    )
    assert math.isclose(res.fun, prob.f_star, abs_tol=1e-12)
    assert np.allclose(res.x, prob.theta_star, atol=1e-6)
    assert math.isclose(prob.R, tridiag_radius(d), rel_tol=1e-14)
    assert math.isclose(prob.R, np.linalg.norm(prob.theta_star), rel_tol=1e-12)
    # Hessian in θ: Q A Qᵀ, A = (β/4) tridiag(-1, 2, -1); its norm is <= β (and close to it)
    q = chain_map(prob.spec)
    a = beta / 4 * (2 * np.eye(d) - np.eye(d, k=1) - np.eye(d, k=-1))
    hess = np.array(
        [
            (ref.loss_and_grad(1e-4 * e)[1] - ref.loss_and_grad(-1e-4 * e)[1]) / 2e-4
            for e in np.eye(d)
        ]
    )
    assert np.allclose(hess, q @ a @ q.T, atol=1e-8)
    eig = np.linalg.eigvalsh(q @ a @ q.T)
    assert eig.min() > 0 and eig.max() <= beta and eig.max() > 0.9 * beta


def test_tridiag_gradient_matches_finite_differences():
    prob = tridiag_chain(2, 7, 1)
    ref = Reference(prob.spec, prob.batch, "input")
    th = np.random.default_rng(0).standard_normal(7)
    g = ref.loss_and_grad(th)[1]
    h = 1e-6
    fd = [
        (ref.loss_and_grad(th + h * e)[0][0] - ref.loss_and_grad(th - h * e)[0][0]) / (2 * h)
        for e in np.eye(7)
    ]
    assert np.allclose(g, fd, atol=1e-8)


def test_span_gap_holds_along_agd_and_gd_and_is_tight_at_the_optimum_of_the_span():
    d, beta = 21, 1.0
    prob = tridiag_chain(2, d, 0, beta)
    ref = Reference(prob.spec, prob.batch, "input")
    for mom in ("nesterov", 0.0):  # AGD and GD: both span methods
        th, prev = np.zeros(d), np.zeros(d)
        for t in range(1, d + 3):
            mu = (t - 1) / (t + 2) if mom == "nesterov" else 0.0
            y = th + mu * (th - prev)
            prev, th = th, y - ref.loss_and_grad(y)[1] / beta
            gap = ref.loss_and_grad(th)[0][0] - prob.f_star
            assert gap >= tridiag_span_gap(t, d, beta) - 1e-12, (mom, t)
    # the bound is the exact minimum over the first t coordinates of z (checked by solve)
    q = chain_map(prob.spec)
    for t in (1, 5, 12):
        a = beta / 4 * (2 * np.eye(t) - np.eye(t, k=1) - np.eye(t, k=-1))
        z = np.linalg.solve(a, beta / 4 * np.eye(t)[0])
        zt = np.concatenate([z, np.zeros(d - t)])
        f = ref.loss_and_grad(zt @ q.T)[0][0]
        assert math.isclose(f - prob.f_star, tridiag_span_gap(t, d, beta), abs_tol=1e-12)


def test_span_iterations_and_dimension_rules():
    for eps in (0.05, 0.02, 0.013):
        d = tridiag_dim(eps)
        T = math.ceil(math.sqrt(2 * tridiag_radius(d) ** 2 / eps))
        assert d >= 2 * T + 1
        T1 = math.ceil(math.sqrt(2 * tridiag_radius(d - 1) ** 2 / eps))
        assert d - 1 < 2 * T1 + 1  # the least such d
        n = tridiag_span_iterations(eps, d)
        assert tridiag_span_gap(n, d) <= eps < tridiag_span_gap(n - 1, d)
    with pytest.raises(ValueError, match="epsilon"):
        tridiag_dim(0.0)


# ---------------------------------------------------------------- smooth Θ rows


def _tridiag(out, label, eps, depth, **extra):
    values = dict(problem="tridiag-chain", dim=tridiag_dim(eps), depth=depth, epsilon=eps)
    values.update({"tag": "smooth", "optimizer": "agd", "mode": "theory", **extra})
    return _run(out, label, **values)


@pytest.fixture(scope="module")
def smooth_clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("smooth")
    for eps in (0.05, 0.02):
        for depth in (2, 8):
            _tridiag(out, f"e{eps}-D{depth}", eps, depth)
    return out


def test_smooth_sandwich_holds_on_the_worst_case(smooth_clean, tmp_path):
    rows = _rows(smooth.study(load_records(smooth_clean), tmp_path))
    assert _find(rows, "span lower bound covers").ok
    lo, up = _find(rows, "time to eps >= N_lb"), _find(rows, "time to eps <= T")
    assert lo.ok and up.ok and lo.kind == up.kind == "bound"
    assert "c_lo in" in lo.bound and "c_hi in" in up.bound
    assert (tmp_path / "smooth-worstcase.png").stat().st_size > 2000


def test_smooth_lower_side_fails_for_a_timing_that_charges_the_depth_once(smooth_clean, tmp_path):
    recs = _charge_depth_once(load_records(smooth_clean))
    rows = _rows(smooth.study(recs, tmp_path))
    assert _find(rows, "time to eps >= N_lb").ok is False
    assert _find(rows, "time to eps <= T").ok  # only the lower side sees it


def test_smooth_upper_side_fails_for_agd_without_momentum(tmp_path):
    eps, d = 0.005, tridiag_dim(0.005)
    T = math.ceil(math.sqrt(2 * tridiag_radius(d) ** 2 / eps))
    _tridiag(tmp_path, "gd", eps, 2, mode="practical", momentum="0", lr=1.0, iterations=T)
    rows = _rows(smooth.study(load_records(tmp_path), tmp_path))
    assert _find(rows, "time to eps <= T").ok is False
    assert _find(rows, "time to eps >= N_lb").ok


# ---------------------------------------------------------------- non-smooth rows

K16 = dict(problem="nesterov-chain", dim=16, epsilon=0.0625, tag="lower")


@pytest.fixture(scope="module")
def lower_clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("lower")
    for opt in ("gd", "agd", "pprs"):
        for depth in (2, 16):
            _run(out, f"{opt}-D{depth}", optimizer=opt, mode="theory", depth=depth, **K16)
    return out


def test_lower_rows_hold_on_nesterov_chain(lower_clean, tmp_path):
    res = lower.study(load_records(lower_clean), tmp_path)
    rows = _rows(res)
    assert _find(rows, "the instances are hard").ok
    for words in ("span methods): time to eps >=", "GD: time to eps <=", "PPRS: time to eps <="):
        v = _find(rows, words)
        assert v.ok and v.kind == "bound", words
    claim = _find(rows, "PPRS does not beat")
    assert claim.kind == "claim" and claim.ok
    assert any("regime: nesterov-chain" in n for n in res.notes)


def test_lower_figure_names_a_method_that_never_reached_eps():
    def row(method, depth, time):
        return dict(executor="simulated", method=method, x=40.0, depth=depth, time=time,
                    lb_form=10.0)  # fmt: skip

    nan = math.nan
    rows = [row("gd", 2, 30.0), row("gd", 4, 50.0), row("agd", 2, nan), row("agd", 4, nan)]
    labels = {label: ys for label, _, ys, _ in lower._series(rows)}
    assert set(labels) == {"agd, x = 40: eps not reached", "gd, x = 40"}
    assert labels["gd, x = 40"] == [3.0, 5.0]


def test_lower_bound_fails_for_a_timing_that_charges_the_depth_once(lower_clean, tmp_path):
    recs = _charge_depth_once(load_records(lower_clean))
    rows = _rows(lower.study(recs, tmp_path))
    assert _find(rows, "span methods): time to eps >=").ok is False


def test_pprs_upper_bound_fails_when_the_pipeline_pays_the_depth_once_per_sample(tmp_path):
    L, R = 1.0 + 2.0 / math.sqrt(16), 1.0  # nesterov-chain, k = 16
    values = practical("pprs", K16["epsilon"], L, R, 16)
    values = plant({**values, "schedule": "gpipe"}, "depth-per-sample")
    _run(tmp_path, "pprs-seq", depth=16, **{**K16, **values})
    rows = _rows(lower.study(load_records(tmp_path), tmp_path))
    assert _find(rows, "PPRS: time to eps <=").ok is False


# ---------------------------------------------------------------- smooth non-convex


def test_zero_chain_gradient_matches_finite_differences_and_is_a_zero_chain():
    from hpcpipe.model.losses import ZeroChain

    head = ZeroChain()
    z = np.random.default_rng(1).uniform(-2, 3, (3, 6))
    _, g = head(z, None, 1.0)
    h = 1e-6
    for r in range(3):
        for j in range(6):
            e = np.zeros_like(z)
            e[r, j] = h
            fd = (head(z + e, None, 1.0)[0] - head(z - e, None, 1.0)[0]) / (2 * h)
            assert math.isclose(g[r, j], fd, abs_tol=1e-7)
    # zero chain: with |z_j| <= 1/2 the gradient has no component beyond j + 1
    z = np.array([[2.0, 0.3, 0.0, 0.0, 0.0]])
    assert np.all(head(z, None, 1.0)[1][0, 3:] == 0.0) and head(z, None, 1.0)[1][0, 2] == 0.0


def test_zero_chain_constants_against_scipy_and_the_derivative_bounds():
    from scipy.optimize import minimize as smin

    from hpcpipe.model.losses import ZeroChain
    from hpcpipe.problems.nonconvex import zero_chain, zero_chain_gap0, zero_chain_inf

    x = np.linspace(-6, 6, 20001)
    psi, dpsi = ZeroChain.psi(x)
    phi, dphi = ZeroChain.phi(x)
    d2psi = np.gradient(dpsi, x)
    assert psi.max() <= math.e and dpsi.max() <= math.sqrt(54 / math.e)
    assert np.abs(d2psi).max() <= 32.5 and phi.max() <= math.sqrt(2 * math.pi * math.e)
    assert dphi.max() <= math.sqrt(math.e) + 1e-12
    T = 5
    prob = zero_chain(2, T, 0)
    ref = Reference(prob.spec, prob.batch, "input")
    f0 = ref.loss_and_grad(np.zeros(T))[0][0]
    assert math.isclose(f0 - prob.f_star, zero_chain_gap0(T), rel_tol=1e-12)
    assert zero_chain_gap0(T) <= 12 * T
    rng = np.random.default_rng(2)
    best = math.inf
    for _ in range(6):  # scipy never goes below the derived infimum, and gets close to it
        res = smin(
            lambda th: ref.loss_and_grad(th)[0][0],
            rng.uniform(0, 8, T) @ chain_map(prob.spec).T,
            jac=lambda th: ref.loss_and_grad(th)[1],
            method="L-BFGS-B",
        )
        assert res.fun >= zero_chain_inf(T) - 1e-9
        best = min(best, res.fun)
    assert best - zero_chain_inf(T) < 1e-3
    # beta = 152 bounds the Hessian (finite differences) at random points
    q = chain_map(prob.spec)
    for _ in range(8):
        th = rng.uniform(-3, 3, T) @ q.T
        hess = np.array(
            [
                (ref.loss_and_grad(th + 1e-5 * e)[1] - ref.loss_and_grad(th - 1e-5 * e)[1]) / 2e-5
                for e in np.eye(T)
            ]
        )
        assert np.abs(np.linalg.eigvalsh((hess + hess.T) / 2)).max() <= prob.beta
    # the gradient is large while |z_T| < 1 (Carmon et al. 2020, Lemma 3)
    for _ in range(200):
        z = rng.uniform(-3, 3, T)
        z[-1] = rng.uniform(-1, 1)
        assert np.linalg.norm(ref.loss_and_grad(z @ q.T)[1]) > 1


def _zero(out, label, depth, lr_scale=1.0, iterations=4000, T=4, eps=1.0):
    _run(
        out,
        label,
        problem="zero-chain",
        dim=T,
        depth=depth,
        epsilon=eps,
        tag="nonconvex",
        optimizer="gd",
        lr=lr_scale / 152,
        iterations=iterations,
        eval_every=0,
    )


@pytest.fixture(scope="module")
def nonconvex_clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("nonconvex")
    for depth in (2, 128):  # at 128 a depth charged once beats the bound (T = 4, 327 calls)
        _zero(out, f"D{depth}", depth)
    return out


def test_nonconvex_rows_hold(nonconvex_clean, tmp_path):
    from hpcpipe.studies import nonconvex

    res = nonconvex.study(load_records(nonconvex_clean), tmp_path)
    rows = _rows(res)
    assert _find(rows, "lower bound applies").ok
    assert _find(rows, "time to ||grad f|| <= eps >=").ok
    assert _find(rows, "time to ||grad f|| <= eps <=").ok
    assert any("regime: zero-chain" in n for n in res.notes)


def test_nonconvex_lower_side_fails_for_a_timing_that_charges_the_depth_once(
    nonconvex_clean, tmp_path
):
    from hpcpipe.studies import nonconvex

    recs = _charge_depth_once(load_records(nonconvex_clean))
    rows = _rows(nonconvex.study(recs, tmp_path))
    assert _find(rows, "time to ||grad f|| <= eps >=").ok is False


def test_nonconvex_upper_side_fails_for_a_step_divided_by_64(tmp_path):
    from hpcpipe.problems.nonconvex import gd_calls
    from hpcpipe.studies import nonconvex

    # eps = 1.2: N_ub = 7552 calls; GD needs 298 at 1/beta, about 19000 at 1/(64 beta)
    _zero(tmp_path, "slow", 2, lr_scale=1 / 64, iterations=gd_calls(4, 1.2), eps=1.2)
    rows = _rows(nonconvex.study(load_records(tmp_path), tmp_path))
    assert _find(rows, "time to ||grad f|| <= eps <=").ok is False


def test_mpi_spot_check_row_pairs_runs_and_fails_on_a_different_time(nonconvex_clean):
    import copy

    from hpcpipe.studies.common import mpi_equals_simulated

    sims = load_records(nonconvex_clean)
    twin = copy.deepcopy(sims[0])
    twin.executor, twin.file = "mpi", "spot.h5"
    key = lambda r: (r.config["depth"], r.config["dim"])  # noqa: E731
    assert mpi_equals_simulated("nonconvex", [*sims, twin], key).ok
    twin.it["pipeline_time"] = twin.it["pipeline_time"] * (1 + 1e-9)
    row = mpi_equals_simulated("nonconvex", [*sims, twin], key)
    assert row.ok is False and row.kind == "consistency" and row.files == ["spot.h5"]
    assert mpi_equals_simulated("nonconvex", sims, key) is None  # no MPI run: no row
