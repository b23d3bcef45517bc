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
