"""The depth study: predictions, rows that can fail, and planted faults that fail them."""

import dataclasses
import json
import math

import pytest

from hpcpipe.studies import depth
from hpcpipe.studies.common import load_records
from hpcpipe.studies.depth_runs import DepthPlan, dim_for, main, plant, run_study, spot_sweep
from hpcpipe.studies.sweep import load_sweep

# nesterov-chain at x = RL/eps = 16: d = k = 16, eps = 0.09375, T_GD = 256, T_PPRS = 256, K = 11
SMALL = dict(problem="nesterov-chain", xs=(16.0,), tuned=False, spot_depths=(), workers=1)


def test_crossover_predictions():
    # bounds' constants at d = 16, x = 64: T_GD = x^2, T_PPRS = 8x d^(1/4), K = 8x/d^(1/4)
    x, q = 64, 2.0
    got = depth.law_crossover(x * x, 8 * x * q, int(8 * x / q))
    assert got == pytest.approx((64 * x - 8 * q) / (x - 8 * q))  # DESIGN.md's ratio = 1
    assert depth.law_ratio(x * x, 8 * x * q, int(8 * x / q), got) == pytest.approx(1.0)
    assert depth.law_crossover(10, 20, 5) == math.inf  # GD needs fewer iterations: never
    assert depth.crossover([2, 8, 32], [0.5, 2.0, 4.0]) == pytest.approx(4.0)  # log-log
    assert depth.crossover([2, 8], [0.5, 0.9]) == math.inf
    # times on the GPipe law I·2(K + Δ − 1) with fixed counts: the crossing is the law's
    # Δ* exactly, also on a grid as coarse as the study's (64 → 4096); the ratio's log-log
    # interpolation would put it at 1834, against 545
    i_gd, i_pp, K, grid = 2048.0, 1500.0, 200, [2, 64, 4096]
    t_gd = [i_gd * 2 * D for D in grid]
    t_pp = [i_pp * 2 * (K + D - 1) for D in grid]
    law = depth.law_crossover(i_gd, i_pp, K)
    assert 64 < law < 4096
    assert depth.crossover_of_times(grid, t_gd, t_pp) == pytest.approx(law, rel=1e-12)
    ratio = [a / b for a, b in zip(t_gd, t_pp)]
    assert depth.crossover(grid, ratio) > 2 * law
    assert depth.crossover_of_times([2, 8], [1.0, 2.0], [3.0, 4.0]) == math.inf
    assert depth.crossover_of_times([2, 8], [5.0, 6.0], [3.0, 4.0]) == 2.0  # ahead at once
    # the measured crossover against the range the iteration counts allow, within 2x
    assert depth.crossover_agrees(304.0, 150.0, math.inf, 2, 2048)  # counts 15-16 vs 16
    assert not depth.crossover_agrees(304.0, 50.0, 120.0, 2, 2048)  # above 2 x 120
    assert not depth.crossover_agrees(20.0, 50.0, 120.0, 2, 2048)  # below 50 / 2
    assert depth.crossover_agrees(math.inf, math.inf, math.inf, 2, 2048)  # never, never
    assert not depth.crossover_agrees(math.inf, 50.0, 120.0, 2, 2048)  # should have crossed
    assert depth.crossover_agrees(2.0, 1.0, 1.5, 2, 2048)  # already ahead at the first depth


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
    assert _find(clean, "final iterate within eps").ok
    assert _find(clean, "smooths within the plan's bias budget").ok
    inside = _find(clean, "runs inside its theorem")
    assert inside.ok and inside.kind == "consistency"
    check = _find(clean, "closed form")
    assert check.kind == "consistency" and check.ok and check.executor == "simulated"
    claim = _find(clean, "PPRS faster than GD at the largest depth")
    assert claim.kind == "claim" and "predicted GD/PPRS time ratio" in claim.bound


@pytest.mark.parametrize(
    "fault,row",
    [
        ("k1", "pays the depth once per iteration: iteration time"),
        ("gamma30", "smooths within the plan's bias budget"),
        ("no-momentum", "final iterate within eps"),
        ("no-momentum", "pprs reaches eps"),
        ("step4", "runs inside its theorem"),
        ("depth-per-sample", "pays the depth once per iteration: iteration time"),
    ],
)
def test_planted_fault_fails_its_row(tmp_path, fault, row):
    rows = _rows(tmp_path, fault, methods=("pprs",))
    assert _find(rows, row).ok is False


def test_hard_instance_dimension_follows_x():
    # d = k = floor(x^2/16): the chain length that makes nesterov-chain hard at eps = RL/x
    assert [dim_for(DepthPlan(), x) for x in (16.0, 32.0, 64.0)] == [16, 64, 256]
    assert dim_for(DepthPlan(problem="l1-chain", dim=8), 64.0) == 8
    with pytest.raises(ValueError, match="nesterov-chain"):
        dim_for(DepthPlan(problem="l1-chain"), 16.0)


def test_bad_study_options_exit_2(capsys):
    assert main(["--problem", "l1-chain", "--out", "unused"]) == 2
    assert "--dim 0" in capsys.readouterr().out
    assert main(["--xs", "2", "--out", "unused"]) == 2
    assert main(["--depths", "0", "--out", "unused"]) == 2


def test_plant_changes_only_its_setting():
    base = {"samples": 8, "gamma": 0.1, "momentum": "nesterov", "lr": 0.5, "schedule": "gpipe"}
    assert plant(base, "k1")["samples"] == 1 and plant(base, "k1")["gamma"] == 0.1
    assert plant(base, "gamma30")["gamma"] == pytest.approx(3.0)
    assert plant(base, "step4")["lr"] == 2.0 and plant(base, "no-momentum")["momentum"] == "0"
    assert plant(base, "depth-per-sample")["schedule"] == "sequential"
    with pytest.raises(ValueError, match="fault"):
        plant(base, "nonsense")


def test_tuned_runs_and_the_spot_sweep(tmp_path):
    """Tuning and tuned runs on a tiny grid; the MPI spot checks' sweep file (run by the study
    with ``hpcpipe sweep``; simulated = MPI itself is the MPI suite's test)."""
    out = tmp_path / "full"
    plan = DepthPlan(
        out=str(out),
        problem="nesterov-chain",
        xs=(10.0, 12.0),
        methods=("gd", "pprs"),
        depths=(2,),
        factors=(1.0, 4.0),
        spot_depths=(),
        workers=1,
    )
    run_study(plan, log=lambda *a: None)
    factors = json.loads((out / "tuned-factors.json").read_text())
    assert set(factors) == {f"{o} x={x}" for o in ("gd", "pprs") for x in (10, 12)}
    assert set(factors.values()) <= {1.0, 4.0}
    recs = load_records(out)
    assert {depth.setting(r) for r in recs} == {"theory", "tuned", "tune"}
    assert {(depth.x_of(r), int(r.problem["dim"])) for r in recs} == {(10, 6), (12, 9)}
    rows = {v.claim: v for v in depth.study(recs, tmp_path).verdicts}
    assert any("at the largest depth 2 (tuned, x = 12)" in c for c in rows)
    # two factors: every best is at an edge, so no tuned row is known to be at its best
    tuning = _find(rows, "tuned step lies inside its tuning grid")
    assert tuning.ok is False and tuning.kind == "design" and "0/4" in tuning.measured
    spots = dataclasses.replace(plan, spot_depths=(2, 4, 8), depths=(2, 4))
    sweep = load_sweep(str(spot_sweep(spots)))
    assert len(sweep.points) == 2 * 2 * 2  # depth 8 has no simulated partner: not run
    for pt in sweep.points:
        cfg = pt.config()
        x = {6: 10, 9: 12}[cfg.dim]
        assert cfg.executor == "mpi" and cfg.iterations == plan.spot_iterations
        assert cfg.epsilon == pytest.approx((1 + 2 / math.sqrt(cfg.dim)) / x, rel=1e-15)
        assert pt.ranks == cfg.depth


class _Tune:
    """A tuning run as the depth analysis reads it: tag, optimizer, step, time to eps."""

    def __init__(self, opt: str, lr: float, time: float):
        self.config = {"tag": "depth/tune", "optimizer": opt, "lr": lr, "epsilon": 0.5}
        self.problem = {"R": 1.0, "L": 2.0, "name": "nesterov-chain"}
        self.executor, self.file, self._time = "simulated", f"{opt}-{lr}.h5", time

    def first_reach(self, eps):
        return (1 if math.isfinite(self._time) else math.inf), self._time


@pytest.mark.parametrize(
    "times, ok",
    [
        ((9.0, 3.0, 5.0), True),  # best in the middle
        ((9.0, 5.0, 3.0), False),  # best at the largest step: it may lie beyond the grid
        ((3.0, 5.0, math.inf), False),  # best at the smallest step
        ((math.inf, 3.0, math.inf), True),  # the steps around the best do not reach eps
    ],
)
def test_tuning_row_fails_when_the_best_step_is_at_an_edge(times, ok):
    recs = [_Tune("pprs", lr, t) for lr, t in zip((0.1, 0.4, 1.6), times)]
    recs += [_Tune("gd", lr, t) for lr, t in zip((0.1, 0.4, 1.6), (9.0, 3.0, 5.0))]
    res = depth.StudyResult(depth.NAME)
    depth._tuning(res, recs)
    (row,) = res.verdicts
    assert row.ok is ok and row.kind == "design"
    assert ("pprs x = 4" in row.measured) is (not ok)


def test_tuning_row_lists_a_method_that_no_step_brings_to_eps():
    recs = [_Tune("agd", lr, math.inf) for lr in (0.1, 0.4, 1.6)]
    recs += [_Tune("gd", lr, t) for lr, t in zip((0.1, 0.4, 1.6), (9.0, 3.0, 5.0))]
    res = depth.StudyResult(depth.NAME)
    depth._tuning(res, recs)
    (row,) = res.verdicts
    assert row.ok is True and "1/1" in row.measured
    assert "no step of the grid reaches eps: agd x = 4" in row.measured


@pytest.mark.parametrize("kind, code", [("design", 1), ("claim", 0), ("bound", 1)])
def test_report_exit_status_follows_enforced_rows(kind, code, tmp_path, monkeypatch, capsys):
    """A failed design row (runs outside the study's regime) fails `hpcpipe analyze` as a
    violated bound does; a claim that is not reproduced does not."""
    from hpcpipe.studies import report
    from hpcpipe.studies.common import Verdict

    res = depth.StudyResult(depth.NAME)
    res.verdicts.append(Verdict(depth.NAME, "a row", "its rule", "its figure", False, [], kind))
    monkeypatch.setattr(report, "analyse", lambda *a, **k: ([res], tmp_path / "report.md"))
    assert report.main([str(tmp_path), "-o", str(tmp_path / "r")]) == code
    out = capsys.readouterr().out
    assert (res.verdicts[0].word in out) is (code == 1)


def test_report_rows_keep_their_columns_when_a_cell_holds_a_norm(tmp_path):
    """'||grad f||' in a claim must not split the Markdown row into more cells."""
    from hpcpipe.studies import report
    from hpcpipe.studies.common import Verdict

    res = depth.StudyResult("nonconvex")
    res.verdicts.append(
        Verdict("nonconvex", "time to ||grad f|| <= eps", "a | b", "1 | 2", True, ["f.h5"])
    )
    path = report.write_report([res], tmp_path, [str(tmp_path)])
    rows = [ln for ln in path.read_text().splitlines() if ln.startswith("| nonconvex")]
    assert rows and all(ln.replace("\\|", "").count("|") == 8 for ln in rows)


def test_figure_series_styles_are_distinct_beyond_eight_series():
    from hpcpipe.studies.common import series_style

    styles = [(s["color"], s["marker"], s["markerfacecolor"]) for s in map(series_style, range(60))]
    assert len(set(styles)) == 60


def test_new_x_uses_householder_layers_and_the_reduced_route():
    plan = DepthPlan(xs=(64.0, 128.0), depths=(2, 4, 64, 4096), tuned=False)
    from hpcpipe.studies.depth_runs import groups_of, layers_for, theory_points

    assert layers_for(plan, 64.0) == "dense" and layers_for(plan, 128.0) == "householder"
    ex = {lb: v["executor"] for lb, v in theory_points(plan)}
    assert ex["theory-pprs-x64-D4096"] == "simulated"  # dense: full runs (the shipped grid)
    assert ex["theory-pprs-x128-D2"] == "reduced"  # Δ₀ itself: bitwise the full run
    assert ex["theory-pprs-x128-D4"] == "simulated"  # spot-check depths stay full
    assert ex["theory-pprs-x128-D4096"] == "reduced"
    items = [(lb, v, lb) for lb, v in theory_points(plan)]
    groups = [g for g in groups_of(items) if g[0][1]["executor"] == "reduced"]
    assert len(groups) == 3  # one per method at x = 128: depths 2, 64, 4096 together
    assert all([int(t[1]["depth"]) for t in g] == [2, 64, 4096] for g in groups)


def test_deep_dense_points_of_one_chain_share_a_process_deepest_first():
    """The chain Q₁⋯Q_Δ is built once per process: the dense points at depth >= 128 of one
    (problem, d, seed) form one group, deepest first; shallower ones stay on their own."""
    from hpcpipe.studies.depth_runs import SHARED_CHAIN_DEPTH, groups_of, theory_points

    plan = DepthPlan(xs=(32.0, 64.0), depths=(2, 128, 512, 2048), tuned=False)
    items = [(lb, v, lb) for lb, v in theory_points(plan)]
    groups = groups_of(items)
    assert sorted(lb for g in groups for lb, _, _ in g) == sorted(lb for lb, _, _ in items)
    shared = [g for g in groups if len(g) > 1]
    assert len(shared) == 2  # one per x (its own d): every method's deep points together
    for g in shared:
        assert len({t[1]["dim"] for t in g}) == 1 and len(g) == 3 * 3
        depths = [int(t[1]["depth"]) for t in g]
        assert depths == sorted(depths, reverse=True) and min(depths) >= SHARED_CHAIN_DEPTH
    assert all(int(g[0][1]["depth"]) == 2 for g in groups if len(g) == 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault,row",
    [
        ("k1", "pays the depth once per iteration: iteration time"),
        ("gamma30", "smooths within the plan's bias budget"),
        ("no-momentum", "final iterate within eps"),
        ("step4", "runs inside its theorem"),
        ("depth-per-sample", "pays the depth once per iteration: iteration time"),
    ],
)
def test_planted_fault_fails_its_row_at_x128(tmp_path, fault, row):
    """The planted faults at x = 128 (d = 1024, Householder layers, depths 2 and 4096 on the
    reduced route) still fail their rows."""
    out = tmp_path / fault
    plan = DepthPlan(
        out=str(out),
        xs=(128.0,),
        depths=(2, 4096),
        methods=("pprs",),
        fault=fault,
        tuned=False,
        spot_depths=(),
        workers=1,
    )
    run_study(plan, log=lambda *a: None)
    rows = {v.claim: v for v in depth.study(load_records(out), tmp_path).verdicts}
    assert _find(rows, row).ok is False


def test_theory_crossover_row_is_enforced_where_the_counts_predict_it():
    """Counts predicting a GD/PPRS ratio > 1 at the largest depth and a measurement that
    shows none: the row fails (an enforced row); no crossover predicted: not judged."""
    row = depth._predicted_crossover(128.0, 4096, 1.4, 0.9, [], [])
    assert row.ok is False and row.kind == "bound" and row.word == "VIOLATED"
    assert depth._predicted_crossover(128.0, 4096, 1.4, 1.3, [], []).ok is True
    assert depth._predicted_crossover(16.0, 2048, 0.3, 0.27, [], []).ok is None


def test_budgeted_tuning_chooses_what_full_tuning_chooses(tmp_path, monkeypatch):
    """``run_tuning`` stops a tuning run at the best time to ε so far; the factors chosen
    are those of the full runs, and a step that does not reach ε stops at that time."""
    from hpcpipe.studies import depth_runs

    plan = DepthPlan(
        out=str(tmp_path / "budget"),
        problem="nesterov-chain",
        xs=(16.0,),
        methods=("gd", "pprs"),
        factors=(1 / 16, 1.0, 4.0, 64.0),
        workers=1,
    )
    best = depth_runs.tune(plan, log=lambda *a: None)
    cut = [r for r in load_records(tmp_path / "budget") if r.config.get("time_budget")]
    assert cut, "no tuning run was given a budget"
    stopped = 0
    for r in cut:
        t, gap = r.it["pipeline_time"], r.it["gap"]
        if gap[-1] <= r.config["epsilon"]:  # a better step: it reached ε before the budget
            assert t[-1] <= r.config["time_budget"]
            continue
        assert t[-1] >= r.config["time_budget"] > t[-2]  # stopped by its budget, not before
        assert len(t) < r.config["iterations"]
        stopped += 1
    assert stopped, "no tuning run was stopped by its budget"

    def full(group):  # the same runs without budgets
        return [depth_runs.run_point(item) for item in group]

    monkeypatch.setattr(depth_runs, "run_tuning", full)
    full_plan = dataclasses.replace(plan, out=str(tmp_path / "full"))
    assert depth_runs.tune(full_plan, log=lambda *a: None) == best
    assert not any(r.config.get("time_budget") for r in load_records(tmp_path / "full"))


def test_workers_hold_every_blas_to_one_thread_scipys_own_included():
    """``one_blas_thread``: scipy ships an OpenBLAS of its own, loaded by the first import
    of scipy.linalg; a limit entered before that import left it at its default threads
    (spinning while they wait). In a fresh process, every BLAS loaded is at 1 thread."""
    import ast
    import subprocess
    import sys

    code = (
        "from threadpoolctl import threadpool_info\n"
        "from hpcpipe.studies.depth_runs import one_blas_thread\n"
        "with one_blas_thread():\n"
        "    print([i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    threads = ast.literal_eval(out.stdout)  # the list of ints the child printed
    assert len(threads) >= 2 and set(threads) == {1}, threads  # numpy's BLAS and scipy's
