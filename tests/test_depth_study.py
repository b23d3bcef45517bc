"""The depth study: predictions, rows that can fail, and planted faults that fail them."""

import math

import pytest

from hpcpipe.studies import depth
from hpcpipe.studies.common import load_records
from hpcpipe.studies.depth_runs import DepthPlan, plant, run_study

# max-chain, d = 4, x = RL/eps = 16: small enough for a test (T_PPRS = 182, K = 91)
SMALL = dict(problem="max-chain", dim=4, xs=(16.0,), tuned=False, spot_depths=(), workers=1)


def test_crossover_predictions():
    # bounds' constants at d = 16, x = 64: T_GD = x^2, T_PPRS = 8x d^(1/4), K = 8x/d^(1/4)
    x, q = 64, 2.0
    got = depth.law_crossover(x * x, 8 * x * q, int(8 * x / q))
    assert got == pytest.approx((64 * x - 8 * q) / (x - 8 * q))  # DESIGN.md's ratio = 1
    assert depth.law_ratio(x * x, 8 * x * q, int(8 * x / q), got) == pytest.approx(1.0)
    assert depth.law_crossover(10, 20, 5) == math.inf  # GD needs fewer iterations: never
    assert depth.crossover([2, 8, 32], [0.5, 2.0, 4.0]) == pytest.approx(4.0)  # log-log
    assert depth.crossover([2, 8], [0.5, 0.9]) == math.inf


def _rows(tmp_path, fault="", methods=("gd", "pprs"), depths=(2,)):
    out = tmp_path / (fault or "clean")
    run_study(
        DepthPlan(out=str(out), methods=methods, depths=depths, fault=fault, **SMALL),
        log=lambda *a: None,
    )
    return {v.claim: v for v in depth.study(load_records(out), tmp_path).verdicts}


def _find(rows, words):
    hits = [v for c, v in rows.items() if words in c]
    assert len(hits) == 1, (words, list(rows))
    return hits[0]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _rows(tmp_path_factory.mktemp("depth"))


def test_clean_study_rows_hold(clean):
    assert _find(clean, "pprs reaches eps").ok
    assert _find(clean, "gd reaches eps").ok
    assert _find(clean, "pays the depth once per iteration: iteration time").ok
    check = _find(clean, "closed form")
    assert check.kind == "consistency" and check.ok and check.executor == "simulated"
    claim = _find(clean, "PPRS faster than GD at the largest depth")
    assert claim.kind == "claim" and "predicted GD/PPRS time ratio" in claim.bound


@pytest.mark.parametrize(
    "fault,row",
    [
        ("k1", "pays the depth once per iteration: iteration time"),
        ("no-momentum", "pprs reaches eps"),
        ("depth-per-sample", "pays the depth once per iteration: iteration time"),
    ],
)
def test_planted_fault_fails_its_row(tmp_path, fault, row):
    rows = _rows(tmp_path, fault, methods=("pprs",))
    assert _find(rows, row).ok is False


def test_plant_changes_only_its_setting():
    base = {"samples": 8, "gamma": 0.1, "momentum": "nesterov", "lr": 0.5, "schedule": "gpipe"}
    assert plant(base, "k1")["samples"] == 1 and plant(base, "k1")["gamma"] == 0.1
    assert plant(base, "gamma30")["gamma"] == pytest.approx(3.0)
    assert plant(base, "step4")["lr"] == 2.0 and plant(base, "no-momentum")["momentum"] == "0"
    assert plant(base, "depth-per-sample")["schedule"] == "sequential"
    with pytest.raises(ValueError, match="fault"):
        plant(base, "nonsense")
