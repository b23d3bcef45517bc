"""Wall-clock verdicts know the load: a row of runs on a busy machine (load > cores) is
"not enforced", with the load and how to rerun; on a quiet machine it is judged, and a
planted slowdown fails it; rows of runs that did not record their load stay enforced."""

import numpy as np
import pytest

from hpcpipe.studies import pipeline_time
from hpcpipe.studies.common import Record, load_check

LT = 0.005  # emulated seconds per layer and action


def rec(S: int, K: int, slow: float, load: float | None, cores: int = 2, clock="wall") -> Record:
    """A GPipe run of S one-layer stages, K items; iterations of 2·LT·(K + S − 1)·slow s."""
    per = 2 * LT * (K + S - 1) * slow if clock == "wall" else 2.0 * (K + S - 1)
    info = {} if load is None else {"load_start": load, "load_end": load, "cores": cores}
    return Record(
        file=f"{clock}-S{S}-K{K}.h5",
        config={
            "schedule": "gpipe",
            "clock": clock,
            "depth": S,
            "layer_time": LT if clock == "wall" else 0.0,
            "m": 1,
            "microbatches": 0,
            "mode": "practical",
        },
        method={"samples": K},
        problem={},
        status="complete",
        it={"iteration": np.arange(1.0, 5.0), "pipeline_time": per * np.arange(1.0, 5.0)},
        n_ranks=S,
        info=info,
    )


def wall_rows(slow: float, load: float | None, tmp_path):
    recs = [rec(S, K, slow, load) for S in (2, 3, 4) for K in (1, 4)]
    res = pipeline_time.study(recs, tmp_path)
    return [v for v in res.verdicts if "wall" in v.claim]


def test_quiet_machine_judges_the_wall_clock_rows(tmp_path):
    rows = wall_rows(1.0, 0.5, tmp_path)
    assert len(rows) == 2 and all(v.ok is True for v in rows)
    assert all("load 0.50 on 2 cores" in v.measured for v in rows)
    assert all(v.word == "within bound" for v in rows)


def test_a_planted_slowdown_fails_on_a_quiet_machine(tmp_path):
    rows = wall_rows(1.3, 0.5, tmp_path)  # 30% slower per slot than the model
    slope = [v for v in rows if "slope" in v.claim]
    assert slope and slope[0].ok is False and slope[0].word == "VIOLATED"


@pytest.mark.parametrize("slow", [1.0, 1.3])
def test_a_busy_machine_is_not_enforced_never_failed_nor_passed(slow, tmp_path):
    rows = wall_rows(slow, 2.5, tmp_path)
    for v in rows:
        assert v.ok is None and v.not_enforced
        assert v.word.startswith("not enforced (load 2.50 on 2 cores")
        assert "rerun" in v.word and "hpcpipe sweep" in v.word


def test_runs_without_a_recorded_load_stay_enforced(tmp_path):
    rows = wall_rows(1.3, None, tmp_path)
    slope = [v for v in rows if "slope" in v.claim]
    assert slope[0].ok is False and "load not recorded" in slope[0].measured


def test_speed_up_row_judges_model_pairs_and_reports_busy_wall_pairs(tmp_path):
    recs = [rec(S, K, 1.3, 3.0, clock=c) for S in (2, 3) for K in (1, 4) for c in ("wall", "model")]
    recs += [
        Record(**{**r.__dict__, "file": "seq-" + r.file,
                  "config": {**r.config, "schedule": "sequential"},
                  "it": {**r.it, "pipeline_time": r.it["pipeline_time"] * (
                      (r.method["samples"] * r.n_ranks) / (r.method["samples"] + r.n_ranks - 1))}})
        for r in recs
    ]  # fmt: skip
    res = pipeline_time.study(recs, tmp_path)
    speed = [v for v in res.verdicts if v.claim.startswith("speed-up")]
    assert len(speed) == 1
    assert speed[0].ok is True and "wall-clock pairs not enforced (load 3.00" in speed[0].measured


def test_load_check_uses_the_highest_load_and_the_fewest_cores():
    a, b = rec(2, 1, 1.0, 1.0, cores=4), rec(2, 4, 1.0, 3.5, cores=2)
    text, busy = load_check([a, b], "rerun it")
    assert text == "load 3.50 on 2 cores" and busy.endswith("rerun it")
    assert load_check([a], "x") == ("load 1.00 on 4 cores", "")
