"""Wall-clock verdicts know the load: a row of runs on a busy machine (load > cores) is
"not enforced", with the load and how to rerun; on a quiet machine it is judged, and a
planted slowdown fails it; rows of runs that did not record their load stay enforced."""

import dataclasses
from pathlib import Path

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


# ---------------------------------------------------------------- the calibrated model
D, SLEEP, ALPHA, BETA, T_F, T_B = 16, 0.0051, 300e-6, 1e-9, 20e-6, 30e-6


def machine(ranks: int, alpha: float = ALPHA, busy: bool = False) -> str:
    """A profile of ``ranks`` ranks: orthogonal layers of width D, LT emulated."""
    from hpcpipe.machine.profile import dumps

    sizes = [8, 4096]
    ident = {"host": "h", "cores": 2, "mpi_library": "MPICH"}
    if busy:
        ident.update(busy=True, busy_note="calibrated under load 5.50 on 2 cores (busy machine)")
    return dumps(
        {
            "machine": ident,
            "placement": {"ranks": ranks, "hosts": ["h"], "ranks_per_host": ranks},
            "message": {
                p: {
                    "alpha": alpha,
                    "beta": BETA,
                    "residual": 0.0,
                    "sizes": sizes,
                    "hop_seconds": [alpha + BETA * b for b in sizes],
                    "wakeup": 1e-5,
                }
                for p in ("busy", "yield")
            },
            "layers": [
                {"kind": "orthogonal", "width": D, "rows": 1, "forward": T_F, "backward": T_B}
            ],
            "emulated": {"layer_time": LT, "sleep": SLEEP},
        }
    )


def calibrated_rec(S: int, K: int, noise: float, load: float = 0.5, **kw) -> Record:
    """A GPipe run with a recorded profile whose machine takes ``noise`` times the
    calibrated model's closed form per iteration (α + 8·D·β per message)."""
    from hpcpipe.pipeline.simulator import closed_form

    per = closed_form("gpipe", S, K, T_F + SLEEP, T_B + SLEEP, ALPHA + 8 * D * BETA) * noise
    r = rec(S, K, 1.0, load)
    model = {"kind": "orthogonal", "depth": S, "d_in": D, "d_out": D, "width": 0}
    return dataclasses.replace(
        r,
        problem={"name": "fewshot", "model": model},
        it={**r.it, "pipeline_time": per * r.it["iteration"]},
        machine=machine(S, **kw),
    )


def calibrated_rows(tmp_path, noise: float = 1.0, load: float = 0.5, **kw):
    recs = [calibrated_rec(S, K, noise, load, **kw) for S in (2, 3, 4) for K in (1, 4)]
    res = pipeline_time.study(recs, tmp_path)
    return res, [v for v in res.verdicts if "calibrated model" in v.claim]


def test_the_calibrated_prediction_is_the_closed_form_under_the_profile():
    from hpcpipe.studies.calibrated import iteration_seconds

    for S, K in ((2, 1), (3, 4), (4, 4)):
        r = calibrated_rec(S, K, 1.0)
        assert iteration_seconds(r) == pytest.approx(r.iteration_time, rel=1e-12)


def test_wall_rows_with_a_profile_are_held_to_the_calibrated_model(tmp_path):
    res, rows = calibrated_rows(tmp_path, noise=1.04)
    assert len(rows) == 1 and rows[0].ok is True and rows[0].word == "within bound"
    assert "ratios 1.040..1.040" in rows[0].measured and "over 6 runs" in rows[0].measured
    assert "load 0.50 on 2 cores" in rows[0].measured
    # the uncalibrated slope (2*layer_time per slot, no message cost) is not used with a profile
    assert not [v for v in res.verdicts if "slope" in v.claim]


def test_a_machine_slower_than_its_profile_fails_the_calibrated_row(tmp_path):
    _, rows = calibrated_rows(tmp_path, noise=1.15)
    assert rows[0].ok is False and rows[0].word == "VIOLATED"


def test_planted_fault_a_profile_with_alpha_x10_fails_the_calibrated_row(tmp_path):
    """The runs follow the true profile; the recorded one claims α × 10."""
    recs = [
        dataclasses.replace(calibrated_rec(S, K, 1.0), machine=machine(S, alpha=10 * ALPHA))
        for S in (2, 3, 4)
        for K in (1, 4)
    ]
    res = pipeline_time.study(recs, tmp_path)
    (row,) = [v for v in res.verdicts if "calibrated model" in v.claim]
    assert row.ok is False and row.word == "VIOLATED"
    _, honest = calibrated_rows(tmp_path)  # the same runs with the true profile hold
    assert honest[0].ok is True


@pytest.mark.parametrize("noise", [1.0, 1.3])
def test_a_busy_machine_leaves_the_calibrated_row_not_enforced(noise, tmp_path):
    _, rows = calibrated_rows(tmp_path, noise=noise, load=2.5)
    assert rows[0].ok is None
    assert rows[0].word.startswith("not enforced (load 2.50 on 2 cores")
    assert "hpcpipe calibrate --sweep jobs/sweeps/pipeline-time.toml" in rows[0].word


def test_a_profile_calibrated_under_load_leaves_the_calibrated_row_not_enforced(tmp_path):
    _, rows = calibrated_rows(tmp_path, noise=1.3, busy=True)
    assert rows[0].ok is None
    assert rows[0].word.startswith("not enforced (profile calibrated under load 5.50")


def test_model_clock_law_rows_are_consistency_checks(tmp_path):
    recs = [rec(S, K, 1.0, None, clock="model") for S in (2, 3, 4) for K in (1, 4)]
    res = pipeline_time.study(recs, tmp_path)
    law = [v for v in res.verdicts if "follows" in v.claim]
    assert len(law) == 1 and law[0].kind == "consistency" and law[0].ok is True
    assert law[0].claim.endswith("(model clock; a consistency check)")
    assert law[0].word == "consistent"


def test_the_recorded_model_gives_the_spec_the_run_timed():
    from hpcpipe.model.stages import ModelSpec
    from hpcpipe.studies.calibrated import model_fields, model_spec

    spec = ModelSpec("mlp", depth=4, d_in=64, d_out=10, width=8)
    r = dataclasses.replace(rec(4, 1, 1.0, None), problem={"name": "fewshot", **model_fields(spec)})
    got = model_spec(r)
    assert (got.kind, got.dims()) == ("mlp", [64, 8, 8, 8, 10])


def test_the_shipped_sweep_calibrates_a_profile_per_wall_clock_depth():
    """Each wall-clock depth of jobs/sweeps/pipeline-time.toml names its own profile, which
    `hpcpipe calibrate --sweep` makes for that rank count, width and emulated layer time."""
    from hpcpipe.machine.sweep_profiles import needs

    sweep = Path(__file__).resolve().parent.parent / "jobs" / "sweeps" / "pipeline-time.toml"
    got = {(n.path, n.ranks, tuple(n.widths), n.layer_time) for n in needs(str(sweep))}
    assert got == {(f"results/pipeline-time/machine-np{d}.toml", d, (8,), 0.005) for d in (2, 4)}


def test_the_machinery_records_what_the_study_predicts_from(tmp_path):
    """calibrate --sweep, sweep and analyze on a tiny pipeline-time sweep (depth 2, three
    wall-clock GPipe runs, 2 ms layers): the study's prediction from the recorded profile
    and model equals, bitwise, the one the run made with the profile it was given, and the
    calibrated row is written. Its verdict depends on the machine's load: not checked."""
    import json
    import os
    import subprocess
    import sys

    import h5py

    from hpcpipe.studies.calibrated import iteration_seconds
    from hpcpipe.studies.common import load_records

    (tmp_path / "tiny.toml").write_text(
        '[sweep]\nname = "pipeline-time"\nout = "results/pipeline-time"\nranks = "depth"\n'
        '[base]\ntag = "pipeline-time"\nproblem = "fewshot"\nwidth = 8\noptimizer = "pprs"\n'
        'gamma = 0.01\nlr = 0.01\niterations = 4\neval_every = 0\nprogress = "off"\n'
        '[[cases]]\nlabel = "wall-D2"\nclock = "wall"\ndepth = 2\nlayer_time = 0.002\n'
        'machine = "profiles/np2.toml"\n[grid]\nschedule = ["gpipe"]\nsamples = [1, 2, 4]\n'
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    def hpcpipe(*args):
        p = subprocess.run(
            [sys.executable, "-m", "hpcpipe", *args],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
        )  # fmt: skip
        return p

    cal = hpcpipe("calibrate", "--sweep", "tiny.toml", "--budget", "0.1", "--sizes", "8,128",
                  "--kinds", "mlp")  # fmt: skip
    assert cal.returncode == 0, cal.stdout + cal.stderr
    sw = hpcpipe("sweep", "tiny.toml")
    assert sw.returncode == 0, sw.stdout + sw.stderr
    an = hpcpipe("analyze", "results", "-o", "report", "--study", "pipeline-time")
    assert an.returncode in (0, 1), an.stdout + an.stderr  # 1: a wall-clock row failed (noise)
    recs = load_records(tmp_path / "results" / "pipeline-time")
    assert len(recs) == 3
    for r in recs:
        assert r.problem["model"] == {"kind": "mlp", "depth": 2, "d_in": 64, "d_out": 10,
                                      "width": 8}  # fmt: skip
        with h5py.File(tmp_path / "results" / "pipeline-time" / r.file) as f:
            figures = json.loads(f.attrs["figures"])
        assert iteration_seconds(r) == figures["predicted_pipeline_time"] / figures["iterations"]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "gpipe wall-clock iteration time = the calibrated model's" in report


def test_the_shipped_sweep_without_its_profiles_says_how_to_make_them(tmp_path, monkeypatch):
    """Before `hpcpipe calibrate --sweep`, the sweep names the command, in one line."""
    from hpcpipe.errors import ConfigError
    from hpcpipe.studies.sweep import load_sweep

    monkeypatch.chdir(tmp_path)  # no results/pipeline-time/machine-np*.toml here
    sweep = Path(__file__).resolve().parent.parent / "jobs" / "sweeps" / "pipeline-time.toml"
    with pytest.raises(ConfigError) as e:
        load_sweep(sweep)
    msg = str(e.value)
    assert "machine = 'results/pipeline-time/machine-np2.toml': no such file" in msg
    assert msg.endswith(f"hpcpipe calibrate --sweep {sweep}") and "\n" not in msg


def test_a_run_without_a_recorded_model_is_not_judged_and_says_why(tmp_path):
    """A profile-bearing result of a problem whose model blocks were not recorded cannot be
    predicted: its row says so (never failed, never passed), and the analysis goes on."""
    recs = [
        dataclasses.replace(calibrated_rec(S, K, 1.0), problem={"name": "fewshot"})
        for S in (2, 3, 4)
        for K in (1, 4)
    ]
    res = pipeline_time.study(recs, tmp_path)
    (row,) = [v for v in res.verdicts if "calibrated model" in v.claim]
    assert row.ok is None and row.word.startswith("not enforced (no calibrated prediction: ")
    assert "problem.model" in row.word
