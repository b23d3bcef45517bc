"""The depth-wall analysis: time to ε in seconds against the calibrated model, on records
made from a known profile; planted faults (α × 10 in the profile, the depth-per-sample
pipeline) fail their rows, and a busy machine leaves the bound row not enforced."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hpcpipe.machine.profile import dumps
from hpcpipe.pipeline.simulator import closed_form
from hpcpipe.studies import depth_wall
from hpcpipe.studies.common import Record

D, LT, SLEEP, ALPHA, BETA = 16, 0.002, 0.0021, 40e-6, 1e-9
T_F, T_B = 20e-6, 30e-6
ITS = {"gd": 40, "agd": 35, "pprs": 20}
K = 8
EPS = 0.01
DEPTHS = (2, 4, 8, 16)


def profile(ranks: int, alpha: float = ALPHA) -> str:
    sizes = [8, 4096]
    msg = {
        "alpha": alpha,
        "beta": BETA,
        "residual": 0.0,
        "sizes": sizes,
        "hop_seconds": [alpha + BETA * b for b in sizes],
        "wakeup": 1e-5,
    }
    return dumps(
        {
            "machine": {"host": "h", "cores": 2, "mpi_library": "MPICH"},
            "placement": {"ranks": ranks, "hosts": ["h"], "ranks_per_host": ranks},
            "message": {"sleep": msg},
            "layers": [
                {"kind": "orthogonal", "width": D, "rows": 1, "forward": T_F, "backward": T_B}
            ],
            "emulated": {"layer_time": LT, "sleep": SLEEP},
        }
    )


def true_iteration(depth: int, n: int, schedule: str = "gpipe") -> float:
    """The machine's seconds per iteration: the closed form under the profile's costs."""
    c = ALPHA + D * 8 * BETA
    return closed_form(schedule, depth, n, T_F + SLEEP, T_B + SLEEP, c)


def rec(method, depth, noise=1.0, alpha=ALPHA, schedule="gpipe", load=0.5) -> Record:
    n = K if method == "pprs" else 1
    its = ITS[method]
    per = true_iteration(depth, n, schedule) * noise
    it = np.arange(1.0, its + 1)
    return Record(
        file=f"{method}-D{depth}.h5",
        config={
            "optimizer": method,
            "clock": "wall",
            "depth": depth,
            "dim": D,
            "epsilon": EPS,
            "layer_time": LT,
            "wait": "sleep",
            "m": 1,
            "microbatches": 0,
            "schedule": schedule,
            "tag": "depth-wall",
            "problem": "nesterov-chain",
        },
        method={"samples": n},
        problem={},
        status="complete",
        it={
            "iteration": it,
            "gap": np.linspace(1.0, EPS, its),  # reaches epsilon at the last iteration
            "pipeline_time": per * it,
        },
        n_ranks=depth,
        info={"load_start": load, "load_end": load, "cores": 2},
        machine=profile(depth, alpha),
    )


def runs(**kw) -> list[Record]:
    return [rec(m, d, **kw) for m in ("gd", "agd", "pprs") for d in DEPTHS]


def rows(recs, tmp_path):
    res = depth_wall.study(recs, tmp_path)
    by = {v.kind: v for v in res.verdicts}
    return res, by


def test_per_iteration_is_the_calibrated_closed_form():
    r = rec("pprs", 8)
    assert depth_wall.per_iteration(r) == pytest.approx(true_iteration(8, K), rel=1e-12)


def test_a_machine_that_follows_its_model_holds_every_row(tmp_path):
    recs = [dataclasses.replace(r) for r in runs(noise=1.03)]
    res, by = rows(recs, tmp_path)
    assert by["bound"].ok is True and "ratios 1.030..1.030 over 12 runs" in by["bound"].measured
    assert by["design"].ok is None and "load 0.50 on 2 cores" in by["design"].measured
    assert "load at start 0.50, at end 0.50 (runs: 0.50..0.50)" in by["design"].measured
    claim = by["claim"]
    assert claim.ok is True and claim.word == "reproduced"
    # GD/PPRS = 40·2Δ/(20·2(K + Δ − 1)) ≈ 2Δ/(7 + Δ): crossing 1 between Δ = 4 and 8,
    # measured and predicted alike; the τ clock gives I_PPRS(K − 1)/(I_GD − I_PPRS) = 7
    assert "Delta* measured" in claim.measured and "tau clock 7" in claim.measured
    meas = float(claim.measured.split("Delta* measured ")[1].split(",")[0])
    pred = float(claim.measured.split("predicted (calibrated, s) ")[1].split(",")[0])
    assert 4 < meas < 8 and meas == pytest.approx(pred, rel=1e-9)
    assert any(f.endswith("depth_wall.png") for f in res.figures)
    table = dict((t[0], t) for t in res.tables)
    assert len(table["time to epsilon: measured and predicted seconds"][2]) == 12
    # real layer compute: in the table and the bound row, not in the claim's grid
    real = [dataclasses.replace(r, config={**r.config, "layer_time": 0.0}) for r in runs()[:2]]
    real = [dataclasses.replace(r, file="real-" + r.file) for r in real]
    res2, by2 = rows(recs + real, tmp_path)
    assert "over 14 runs" in by2["bound"].measured and by2["claim"].measured == claim.measured


def test_a_profile_with_alpha_times_ten_fails_the_bound(tmp_path):
    _, by = rows(runs(alpha=10 * ALPHA), tmp_path)
    assert by["bound"].ok is False and by["bound"].word == "VIOLATED"


def test_the_depth_per_sample_pipeline_fails_the_claim(tmp_path):
    recs = [r if r.config["optimizer"] != "pprs" else rec("pprs", r.n_ranks, schedule="sequential")
            for r in runs()]  # fmt: skip
    _, by = rows(recs, tmp_path)
    assert by["claim"].ok is False and by["claim"].word == "not reproduced"
    assert by["bound"].ok is False  # the calibrated GPipe model does not predict it either


def test_a_busy_machine_leaves_the_bound_not_enforced(tmp_path):
    _, by = rows(runs(noise=1.4, load=3.1), tmp_path)
    assert by["bound"].ok is None and by["bound"].word.startswith("not enforced (load 3.10")
    assert by["claim"].ok is None and by["claim"].word.startswith("not enforced (load 3.10")


def test_a_run_that_misses_epsilon_fails_the_bound(tmp_path):
    recs = runs()
    r = recs[0]
    recs[0] = dataclasses.replace(r, it={**r.it, "gap": np.full(len(r.it["gap"]), 1.0)})
    _, by = rows(recs, tmp_path)
    assert by["bound"].ok is False and "1 without epsilon" in by["bound"].measured
    assert not math.isnan(depth_wall.per_iteration(recs[0]))


# ---------------------------------------------------------------- the shipped sweep
SWEEP = Path(__file__).resolve().parent.parent / "jobs" / "sweeps" / "depth-wall.toml"
TUNED = {"gd": 1.0, "pprs": 64.0}  # the depth study's tuned step factors at x = 64


def test_the_shipped_sweep_runs_the_depth_studys_tuned_configurations():
    """x = 64: the practical settings of the depth study's plans, the step scaled by the
    factor its tuning chose; one profile per depth, at that depth's rank count."""
    from hpcpipe.machine.sweep_profiles import needs
    from hpcpipe.studies.depth_runs import DepthPlan, _settings

    data = tomllib.loads(SWEEP.read_text())
    assert data["sweep"]["ranks"] == "depth" and data["base"]["tag"] == "depth-wall"
    base = data["base"]
    assert base["stop_at_epsilon"] == 1 and base["clock"] == "wall" and base["wait"] == "sleep"
    seen = set()
    for case in data["cases"]:
        opt, depth = case["optimizer"], case["depth"]
        (_, _, _, plan), *_ = _settings(DepthPlan(xs=(64.0,), methods=(opt,)))
        got = {**base, **case}
        for key in ("dim", "epsilon", "gamma", "samples", "seed", "layers", "problem"):
            assert got[key] == plan[key], (opt, key)
        assert got["lr"] == pytest.approx(TUNED[opt] * plan["lr"], rel=1e-15)
        assert got.get("momentum") == plan.get("momentum")
        assert got["iterations"] <= plan["iterations"]
        real = "-real" if got["layer_time"] == 0 else ""
        assert got["machine"] == f"results/depth-wall/machine-np{depth}{real}.toml"
        seen.add((opt, depth, got["layer_time"]))
    emulated = {(m, d, 0.002) for m in ("gd", "pprs") for d in (2, 4, 8, 16, 32)}
    assert seen == emulated | {("gd", 2, 0.0), ("pprs", 2, 0.0)}
    got = {
        (n.path, n.ranks, tuple(n.policies), tuple(n.widths), n.layer_time) for n in needs(SWEEP)
    }
    assert got == {
        (f"results/depth-wall/machine-np{d}.toml", d, ("sleep",), (256,), 0.002)
        for d in (2, 4, 8, 16, 32)
    } | {("results/depth-wall/machine-np2-real.toml", 2, ("sleep",), (256,), 0.0)}


def test_one_profile_named_at_two_rank_counts_is_refused(tmp_path):
    from hpcpipe.errors import ConfigError
    from hpcpipe.machine.sweep_profiles import needs

    f = tmp_path / "s.toml"
    f.write_text('[sweep]\nranks = "depth"\n[base]\nmachine = "m.toml"\n[grid]\ndepth = [2, 4]\n')
    with pytest.raises(ConfigError, match="machine = 'm.toml' is named by points with ranks 2"):
        needs(str(f))


# ---------------------------------------------------------------- a profile from a busy machine
def test_calibration_on_a_busy_machine_is_flagged_and_leaves_the_bound_not_enforced(
    tmp_path, monkeypatch
):
    from hpcpipe.machine import calibrate
    from hpcpipe.machine.profile import parse

    monkeypatch.setattr(calibrate, "cores", lambda: 2)
    monkeypatch.setattr(calibrate, "load_average", lambda: [5.5, 3.0, 1.0])
    busy = calibrate.identity([1.0, 1.0, 1.0], "MPICH", "", 1.0)
    assert busy["busy"] is True and busy["load_end"] == [5.5, 3.0, 1.0]
    assert busy["busy_note"].startswith("calibrated under load 5.50 on 2 cores (busy machine)")
    monkeypatch.setattr(calibrate, "load_average", lambda: [1.5, 3.0, 1.0])
    quiet = calibrate.identity([0.5, 1.0, 1.0], "MPICH", "", 1.0)
    assert quiet["busy"] is False and "busy_note" not in quiet

    def text(machine: dict) -> str:
        t = profile(4)
        data = tomllib.loads(t)
        data["machine"].update(machine)
        return dumps(data)

    assert parse(text(busy)).busy and parse(text(busy)).busy_note == busy["busy_note"]
    assert not parse(text(quiet)).busy and parse(text(quiet)).busy_note == ""
    # runs on a quiet machine, with profiles calibrated under load: not enforced, with the note
    recs = [dataclasses.replace(r, machine=text(busy)) for r in runs(noise=1.4)]
    _, by = rows(recs, tmp_path)
    assert by["bound"].ok is None
    assert by["bound"].word.startswith("not enforced (profile calibrated under load 5.50")
    assert "1 of 1 profiles calibrated on a busy machine" in by["design"].measured
    assert by["claim"].ok is None and by["claim"].word.startswith("not enforced (profile")
    recs = [dataclasses.replace(r, machine=text(quiet)) for r in runs(noise=1.4)]
    _, by = rows(recs, tmp_path)
    assert by["bound"].ok is False  # the same runs with a quiet profile are judged


# ---------------------------------------------------------------- the real machinery, tiny
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def hpcpipe(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        capture_output=True, text=True, timeout=600, env=ENV, cwd=cwd,
    )  # fmt: skip


def _toml(v) -> str:
    return json.dumps(v)  # strings, numbers and lists are written alike in TOML and JSON


@pytest.mark.slow
def test_the_sweep_machinery_runs_a_tiny_depth_wall(tmp_path):
    """calibrate --sweep, sweep and analyze on the shipped sweep cut to depth 2 and 4 at
    x = 16 (d = 16, the depth study's practical settings there), 1 ms layers, small
    budgets. What is checked does not depend on the machine's speed: every run reaches
    epsilon at the simulated pipeline's iteration count, the prediction is that count x
    the calibrated pipeline time of an iteration, and the rows are written."""
    from hpcpipe.run.config import make_config
    from hpcpipe.run.runner import run
    from hpcpipe.studies.common import load_records
    from hpcpipe.studies.depth_runs import DepthPlan, _settings

    data = tomllib.loads(SWEEP.read_text())
    base = {**data["base"], "layer_time": 0.001}
    lines = ['[sweep]\nname = "tiny"\nout = "results/depth-wall"\nranks = "depth"', "[base]"]
    lines += [f"{k} = {_toml(v)}" for k, v in base.items()]
    counts = {}
    for opt in ("gd", "pprs"):
        (_, _, _, plan), *_ = _settings(DepthPlan(xs=(16.0,), methods=(opt,)))
        keys = ("dim", "epsilon", "lr", "gamma", "samples") + (
            ("momentum",) if opt == "pprs" else ()
        )
        values = {k: plan[k] for k in keys}
        values["lr"] *= TUNED[opt]
        for depth in (2, 4):
            sim = {**base, **values, "optimizer": opt, "depth": depth, "iterations": 40}
            sim.update(executor="simulated", clock="model", layer_time=0.0, wait="auto", output="")
            res = run(make_config(sim), MPI.COMM_SELF)
            gap = np.asarray(res.column("gap"))
            counts[(opt, depth)] = int(np.flatnonzero(gap <= values["epsilon"])[0]) + 1
            lines += ["[[cases]]", f'label = "{opt}-D{depth}"', f"optimizer = {_toml(opt)}"]
            lines += [f"{k} = {_toml(v)}" for k, v in values.items()]
            lines += [f"depth = {depth}", "iterations = 40"]
            lines += [f'machine = "profiles/np{depth}.toml"']
    sweep = tmp_path / "tiny.toml"
    sweep.write_text("\n".join(lines) + "\n")
    cal = hpcpipe(
        "calibrate", "--sweep", "tiny.toml", "--budget", "0.1", "--sizes", "8,128",
        "--kinds", "orthogonal", cwd=tmp_path,
    )  # fmt: skip
    assert cal.returncode == 0, cal.stdout + cal.stderr
    assert (tmp_path / "profiles" / "np2.toml").is_file()
    assert (tmp_path / "profiles" / "np4.toml").is_file()
    again = hpcpipe("calibrate", "--sweep", "tiny.toml", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.count("kept profiles/") == 2
    sw = hpcpipe("sweep", "tiny.toml", cwd=tmp_path)
    assert sw.returncode == 0, sw.stdout + sw.stderr
    an = hpcpipe("analyze", "results", "-o", "report", "--study", "depth-wall", cwd=tmp_path)
    assert an.returncode in (0, 1), an.stdout + an.stderr  # 1: the bound failed (noise)
    report = (tmp_path / "report" / "report.md").read_text()
    for row in ("the load average recorded by every run", "measured/predicted in [0.9",
                "PPRS reaches epsilon before GD for depth >= Delta*"):  # fmt: skip
        assert row in report
    recs = load_records(tmp_path / "results" / "depth-wall")
    assert len(recs) == 4
    for r in recs:
        its, secs = depth_wall.to_epsilon(r)
        assert its == counts[(r.config["optimizer"], r.n_ranks)], r.file
        assert secs > 0 and len(r.it["iteration"]) == its  # stopped at epsilon
        per = depth_wall.per_iteration(r)
        # an action costs at least the emulated 1 ms: 2Δ of them for GD, 2(K + Δ − 1) PPRS
        assert per >= 2 * (depth_wall.items(r) + r.n_ranks - 1) * 0.001
    assert "![depth-wall](depth_wall.png)" in report


# ---------------------------------------------------------------- the cluster sweep, not run
CLUSTER = SWEEP.parent / "depth-wall-cluster.toml"


def test_the_cluster_sweep_is_the_study_with_real_compute_at_depth_16_to_64():
    """depth-wall-cluster.toml: depth-wall.toml's tuned configurations with real layer
    compute (layer_time = 0), busy waiting (a core per rank), depth 16, 32, 64, and one
    profile per depth made for that rank count, width and policy."""
    from hpcpipe.machine.sweep_profiles import needs
    from hpcpipe.studies.sweep import load_sweep

    local, cluster = tomllib.loads(SWEEP.read_text()), tomllib.loads(CLUSTER.read_text())
    assert cluster["sweep"]["ranks"] == "depth" and cluster["base"]["tag"] == "depth-wall"
    changed = {"layer_time": 0.0, "wait": "busy"}
    assert cluster["base"] == {**local["base"], **changed}
    tuned = {c["optimizer"]: c for c in local["cases"] if c["depth"] == 2 and "layer_time" not in c}
    seen = set()
    for case in cluster["cases"]:
        opt, depth = case["optimizer"], case["depth"]
        drop = ("label", "depth", "machine")
        assert {k: v for k, v in case.items() if k not in drop} == {
            k: v for k, v in tuned[opt].items() if k not in drop
        }
        assert case["machine"] == f"profiles/machine-np{depth}.toml"
        seen.add((opt, depth))
    assert seen == {(m, d) for m in ("gd", "pprs") for d in (16, 32, 64)}
    got = {
        (n.path, n.ranks, tuple(n.policies), tuple(n.widths), n.layer_time) for n in needs(CLUSTER)
    }
    assert got == {
        (f"profiles/machine-np{d}.toml", d, ("busy",), (256,), 0.0) for d in (16, 32, 64)
    }
    sweep = load_sweep(CLUSTER, profiles=False)  # every point valid at its rank count
    assert sorted({p.ranks for p in sweep.points}) == [16, 32, 64] and len(sweep.points) == 6
    assert all(p.ranks == p.values["depth"] for p in sweep.points)


def test_the_cluster_folder_calibrates_each_depth_before_its_array(tmp_path):
    """The generated folder has a calibration job per depth (its tasks and the profile it
    writes), and submit.sh starts each array after its calibration succeeded (afterok),
    the analysis after every array: run with a stand-in sbatch that records its calls."""
    import stat

    from hpcpipe.studies.jobs import JobOptions, generate

    folder = tmp_path / "jobs"
    generate(str(CLUSTER), folder, JobOptions())
    for depth in (16, 32, 64):
        text = (folder / f"calibrate-{depth}.sbatch").read_text()
        assert f"#SBATCH --ntasks={depth}\n" in text
        assert "export HPCPIPE_INSIDE_MPI=1" in text
        profile = f"profiles/machine-np{depth}.toml"
        assert f"if [ -f {profile} ]; then" in text
        assert (
            f'srun --mpi=pmi2 "${{hpcpipe[@]}}" calibrate --np {depth} --output {profile} '
            "--wait busy --width 256\n"
        ) in text
        assert (
            subprocess.run(["bash", "-n", str(folder / f"calibrate-{depth}.sbatch")]).returncode
            == 0
        )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text(
        '#!/bin/bash\nn=$(($(wc -l < "$CALLS" 2>/dev/null || echo 0) + 100))\n'
        'echo "$n $*" >> "$CALLS"\necho "$n;cluster"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    env = dict(ENV, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(calls))
    p = subprocess.run([str(folder / "submit.sh")], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [line.split(" ", 1) for line in calls.read_text().splitlines()]
    ids = {args.split()[-1]: job for job, args in lines}
    for depth in (16, 32, 64):
        array = next(args for _, args in lines if args.endswith(f"array-{depth}.sbatch"))
        assert f"--dependency=afterok:{ids[f'calibrate-{depth}.sbatch']}" in array
    analysis = next(args for _, args in lines if args.endswith("analysis.sbatch"))
    arrays = ":".join(ids[f"array-{d}.sbatch"] for d in (16, 32, 64))
    assert f"--dependency=afterany:{arrays}" in analysis


def test_a_slurm_folder_refuses_a_profile_outside_itself(tmp_path):
    from hpcpipe.errors import ConfigError
    from hpcpipe.studies.jobs import JobOptions, generate

    bad = tmp_path / "bad.toml"
    bad.write_text(CLUSTER.read_text().replace('"profiles/machine-np16.toml"', '"../np16.toml"'))
    with pytest.raises(ConfigError, match=r"machine = '\.\./np16\.toml': a Slurm folder"):
        generate(str(bad), tmp_path / "jobs", JobOptions())
    assert not (tmp_path / "jobs").exists()
