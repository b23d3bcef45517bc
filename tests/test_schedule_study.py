"""The schedule study (hpcpipe.studies.schedules): its premise, its rows and its faults."""

import math

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.schedules import Schedule, ScheduleError
from hpcpipe.studies import schedules as study_mod
from hpcpipe.studies.common import Record
from hpcpipe.studies.depth import law_crossover


@pytest.mark.parametrize("depth", [4, 8])
def test_iterates_do_not_depend_on_the_schedule_only_the_time_per_iteration(depth):
    """The study's premise, on a small case: the same run under every built-in schedule
    has bitwise equal iterates, and its per-iteration pipeline time is the study's
    ``iteration_time`` (t_F = 1, t_B = 2 per layer)."""
    from hpcpipe.run.config import make_config
    from hpcpipe.run.runner import run

    base = dict(
        problem="nesterov-chain", dim=16, depth=depth, optimizer="pprs", samples=4,
        gamma=0.05, lr=0.05, iterations=4, progress="off", seed=3, eval_every=0,
        executor="simulated", clock="model", t_forward=1.0, t_backward=2.0, output="",
    )  # fmt: skip
    thetas = {}
    for name in study_mod.builtin_names():
        v = study_mod.stages_per_rank(name)
        res = run(make_config({**base, "schedule": name, "stages": depth // v}), MPI.COMM_SELF)
        thetas[name] = res.theta
        per = np.diff(np.concatenate([[0.0], res.column("pipeline_time")]))
        want = study_mod.iteration_time(name, depth, 4)
        assert want is not None
        np.testing.assert_allclose(per, want[0], rtol=1e-12, atol=0)
    for name, th in thetas.items():
        np.testing.assert_array_equal(th, thetas["gpipe"], err_msg=name)


def _rec(opt, x, iterations, samples=1, eps=0.1):
    gap = np.full(iterations + 1, 1.0)
    gap[iterations] = eps / 2
    it = {
        "iteration": np.arange(iterations + 1, dtype=float),
        "gap": gap,
        "pipeline_time": np.arange(iterations + 1, dtype=float),
    }
    cfg = {"tag": f"schedules/x={x:g}", "optimizer": opt, "epsilon": eps, "samples": samples}
    return Record(f"{opt}-x{x:g}.h5", cfg, {}, {}, "complete", it, 1, {}, "simulated")


NAMES = ["gpipe", "1f1b", "zb-h1", "looped-bfs", "interleaved-1f1b", "sequential"]
DEPTHS = (4, 16, 64, 256)


def _study(tmp_path, fault="", i_gd=64, i_pp=39, K=16):
    recs = [_rec("gd", 32, i_gd), _rec("pprs", 32, i_pp, K)]
    return study_mod.study(recs, tmp_path, fault=fault, names=NAMES, depths=DEPTHS)


def _claim(res):
    (row,) = [v for v in res.verdicts if v.kind == "claim" and v.ok is not None]
    return row


def test_study_rows_closed_forms_and_crossover(tmp_path):
    res = _study(tmp_path)
    claim = _claim(res)
    assert claim.ok is True and claim.word == "reproduced"
    cf = {
        v.claim.split(", ")[1].split(":")[0]: v for v in res.verdicts if "= closed form" in v.claim
    }
    # one row per schedule with a closed form in its regime somewhere on the grid
    assert set(cf) == set(NAMES)
    assert all(v.ok is True and v.kind == "consistency" for v in cf.values())
    # interleaved 1F1B (v = 2) runs GD's single item and K = 16 items at every depth
    il = [c for c in study_mod.table((64, 39, 16), ["interleaved-1f1b"], DEPTHS) if c["runs"]]
    assert [c["depth"] for c in il] == list(DEPTHS)
    # GPipe's Δ* from the closed forms is the paper's law I_GD·Δ = I_PPRS(K + Δ − 1)
    # with both calls costing (n + Δ − 1)(t_F + t_B)
    cells = study_mod.table((64, 39, 16), ["gpipe"], DEPTHS)
    _, predicted = study_mod.crossovers(cells, (64, 39, 16), "gpipe")
    # (n + Δ − 1) with n = 1 for GD is Δ: the law is exact on the dense integer grid
    assert abs(predicted - law_crossover(64, 39, 16)) < 1.0
    assert (tmp_path / "schedules.png").exists()
    assert any("x = 32: crossover per schedule" in t[0] for t in res.tables)


def test_planted_depth_per_sample_fails_the_claim(tmp_path):
    claim = _claim(_study(tmp_path, fault="depth-per-sample"))
    assert claim.ok is False and claim.word == "not reproduced"
    with pytest.raises(ValueError, match="fault"):
        _study(tmp_path, fault="nonsense")


def test_no_advantage_when_pprs_needs_as_many_iterations_fails_the_claim(tmp_path):
    # a PPRS that needs as many iterations as GD, with K samples per call, never wins
    claim = _claim(_study(tmp_path, i_gd=64, i_pp=64))
    assert claim.ok is False


def test_planted_weight_before_input_schedule_is_refused_by_the_study(monkeypatch):
    def w_first(n_ranks, n_items):
        good = schedules.build("zb-h1", n_ranks, n_items)
        acts = [[str(a) for a in lst] for lst in good.actions]
        last = acts[-1]
        i, w = last.index(f"{n_ranks - 1}I0"), last.index(f"{n_ranks - 1}W0")
        last[i], last[w] = last[w], last[i]  # W(0) before its I(0) on the last stage
        return Schedule.from_lists("w-first", n_items, acts)

    # registered in this test's copy of the registry: later tests never see it
    monkeypatch.setattr(schedules.SCHEDULES, "_entries", dict(schedules.SCHEDULES._entries))
    schedules.register_schedule("test-w-first", w_first, replace=True)
    with pytest.raises(ScheduleError, match="comes before its input gradient"):
        study_mod.iteration_time("test-w-first", 4, 8)


def test_a_schedule_that_cannot_take_the_items_has_no_cell():
    # interleaved 1F1B runs items in rounds of n // max(1, n // P): 15 items on 2 ranks
    # would be 7 rounds, which cannot split them
    assert study_mod.iteration_time("interleaved-1f1b", 4, 15) is None
    assert study_mod.iteration_time("zb-v", 6, 4) is not None  # 3 ranks, 6 stages
    assert study_mod.iteration_time("zb-v", 5, 4) is None  # not a multiple of v = 2
    # zb-v on 4 ranks (Δ = 8) has no closed form for 4 < n < 7 items: no predicted ratio
    assert math.isnan(study_mod.closed_ratio("zb-v", 8, (10, 5, 6)))


@pytest.mark.parametrize("name", ["zb-h1", "zb-v", "looped-bfs"])
def test_closed_ratio_with_fewer_items_than_ranks_is_the_simulators(name):
    # GD's one item and PPRS's K = 3 on Δ = 16 (8 or 16 ranks): n <= P for both calls
    sim = [study_mod.iteration_time(name, 16, n) for n in (1, 3)]
    assert all(math.isfinite(cf) for _, cf in sim)
    want = 10 * sim[0][0] / (5 * sim[1][0])
    assert study_mod.closed_ratio(name, 16, (10, 5, 3)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("depth", "n"), [(4, 1), (8, 1), (64, 1), (64, 15), (16, 12), (8, 6)])
def test_interleaved_gd_and_pprs_calls_run_and_match_the_closed_form(depth, n):
    """GD's single item and PPRS's K items run on Δ/2 ranks, and the simulator's
    makespan is the closed form (v·max(n, P) + min(n, P) − 1)(t_F + t_B), P = Δ/2."""
    got = study_mod.iteration_time("interleaved-1f1b", depth, n)
    assert got is not None
    P = depth // 2
    want = (2 * max(n, P) + min(n, P) - 1) * (study_mod.T_F + study_mod.T_B)
    assert got[0] == pytest.approx(want, rel=1e-12, abs=0)
    assert got[1] == pytest.approx(want, rel=1e-12, abs=0)


def test_a_wrong_interleaved_closed_form_fails_its_consistency_row(tmp_path, monkeypatch):
    entry = schedules.entry("interleaved-1f1b")
    wrong = schedules.ScheduleEntry(
        entry.build, lambda S, n, tf, tb, c=0.0, **_: (2 * n + S - 1) * (tf + tb)
    )  # the P | n form used for every n
    monkeypatch.setitem(schedules.SCHEDULES._entries, "interleaved-1f1b", wrong)
    study_mod.iteration_time.cache_clear()
    try:
        res = _study(tmp_path)
    finally:
        study_mod.iteration_time.cache_clear()
    (row,) = [v for v in res.verdicts if "interleaved-1f1b: pipeline time" in v.claim]
    assert row.ok is False and row.kind == "consistency"


def test_a_wrong_zb_h1_closed_form_for_few_items_fails_its_consistency_row(tmp_path, monkeypatch):
    entry = schedules.entry("zb-h1")

    def n_ge_p_form_everywhere(S, n, tf, tb, c=0.0, **_):  # the n >= P form used for n < P
        ti = tw = tb / 2
        return n * (tf + ti + tw) + (S - 1) * (tf + ti - tw)

    wrong = schedules.ScheduleEntry(entry.build, n_ge_p_form_everywhere)
    monkeypatch.setitem(schedules.SCHEDULES._entries, "zb-h1", wrong)
    study_mod.iteration_time.cache_clear()
    try:
        res = _study(tmp_path)
    finally:
        study_mod.iteration_time.cache_clear()
    (row,) = [v for v in res.verdicts if "zb-h1: pipeline time" in v.claim]
    assert row.ok is False and row.kind == "consistency"
