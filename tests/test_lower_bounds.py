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
