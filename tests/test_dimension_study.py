"""The dimension study: its sweep file, its rows on small runs, and planted faults failing them."""

from pathlib import Path

import pytest

from hpcpipe.studies import dimension
from hpcpipe.studies.common import load_records
from hpcpipe.studies.dimension_runs import DimensionPlan, run_study, setting_values, sweep_text

ROOT = Path(__file__).parent.parent

GUARANTEE = "PPRS at its plan reaches eps at the final iterate (AC-SA theorem)"
SPEED = "no run reaches eps before the speed limit n_min(eta) of its step"
TIME = "PPRS iteration time = (t_F + t_B)(K*m + Delta - 1) with the plan's K"


def test_shipped_sweep_is_the_generated_one():
    """jobs/sweeps/dimension.toml is sweep_text of the defaults (regenerate it, do not edit)."""
    shipped = (ROOT / "jobs" / "sweeps" / "dimension.toml").read_text()
    assert shipped == sweep_text(DimensionPlan()), (
        "run python -m hpcpipe.studies.dimension_runs --write-sweep jobs/sweeps/dimension.toml"
    )


def test_settings_scale_the_plan():
    plan = setting_values("plan", 0.1, 256)
    c8, g0, g30 = (setting_values(s, 0.1, 256) for s in ("c8", "gamma0", "gamma30"))
    assert plan["iterations"] == 320 and plan["samples"] == 4  # T = ⌈8·4/0.1⌉
    assert plan["lr"] == pytest.approx(plan["gamma"] / 4)  # η = γ/(4L) at this d
    assert (c8["gamma"], c8["lr"]) == (8 * plan["gamma"], 8 * plan["lr"])
    assert (g0["gamma"], g0["lr"]) == (0.0, plan["lr"])
    assert (g30["gamma"], g30["lr"]) == (30 * plan["gamma"], plan["lr"])
    assert {v["iterations"] for v in (c8, g0, g30)} == {320}


def _rows(tmp_path, fault: str = "") -> dict:
    """Plan runs at d = 16, ε = 0.25, two seeds (T = 64), with a planted fault; rows by claim."""
    out = tmp_path / (fault or "clean")
    plan = DimensionPlan(
        out=str(out),
        dims=(16,),
        eps=0.25,
        seeds=(0, 1),
        settings=("plan",),
        spot_dims=(),
        workers=1,
        fault=fault,
    )
    run_study(plan, log=lambda m: None)
    res = dimension.study(load_records(out), tmp_path)
    return {v.claim: v for v in res.verdicts}


def test_clean_runs_pass_the_rows_that_faults_fail(tmp_path):
    rows = _rows(tmp_path)
    for claim in (GUARANTEE, SPEED, TIME):
        assert rows[claim].ok is True, rows[claim]


@pytest.mark.parametrize(
    "fault, claim",
    [
        ("k1", TIME),  # K = 1: the iterations cost 2(1 + Δ − 1), not 2(K + Δ − 1)
        ("depth-per-sample", TIME),
        ("gamma30", GUARANTEE),  # bias floor 1.69 ε
        ("no-momentum", GUARANTEE),
        ("step4", SPEED),  # reaches ε before a step η can
    ],
)
def test_planted_fault_fails_its_row(tmp_path, fault, claim):
    rows = _rows(tmp_path, fault)
    assert rows[claim].ok is False, rows[claim]
    assert rows[claim].word in ("VIOLATED", "INCONSISTENT")


def test_finite_d_fit_recovers_an_offset_and_its_local_exponent():
    """n = a d^(1/4) + b with b < 0: the fit finds a and b inside their intervals, the local
    exponent exceeds 1/4 at small d and nears it at large d, and a straight log-log line over
    the whole range is steeper than over its top half."""
    import numpy as np

    rng = np.random.default_rng(0)
    d = np.repeat(2.0 ** np.arange(4, 17), 3)
    n = 40.0 * d**0.25 - 30.0 + rng.normal(0, 1.0, d.size)
    f = dimension.finite_d_fit(list(zip(d, n)))
    assert f["a_lo"] < 40.0 < f["a_hi"] and f["b_lo"] < -30.0 < f["b_hi"]
    assert f["b_hi"] < 0  # the offset is resolved
    assert dimension.local_exponent(f, 16) > 0.3 > dimension.local_exponent(f, 65536) > 0.25
    whole = dimension._fit(list(zip(d, n)))
    top = dimension._fit(list(zip(d, n)), dimension.TOP)
    assert whole[0] > top[0] > 0.25 and top[3] == 3 * 9  # d = 2^8 … 2^16, three each
    # without an offset the two ranges agree on 1/4
    flat = dimension._fit(list(zip(d, 40.0 * d**0.25)), dimension.TOP)
    assert abs(flat[0] - 0.25) < 1e-12


def test_default_grid_reaches_2_16_with_o_d_layers():
    plan = DimensionPlan()
    assert len(plan.dims) >= 12 and max(plan.dims) == 2**16 and len(plan.seeds) >= 3
    assert plan.layers == "householder"
    text = sweep_text(plan)
    assert '"layers": "householder"' in text or 'layers = "householder"' in text
