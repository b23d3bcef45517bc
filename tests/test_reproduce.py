"""analysis/reproduce.py covers every study of the report with commands that exist."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from hpcpipe.run.config import tomllib
from hpcpipe.studies.report import STUDIES as REPORT_STUDIES

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "analysis" / "reproduce.py"


def _load():
    spec = importlib.util.spec_from_file_location("reproduce", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reproduce", mod)  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def test_every_report_study_is_reproduced():
    assert set(_load().STUDIES) == set(REPORT_STUDIES)


def test_every_step_names_a_sweep_file_or_a_driver_with_out():
    mod = _load()
    for name, steps in mod.STUDIES.items():
        assert steps, name
        for step in steps:
            if step.sweep or step.calibrate:
                sweep = step.sweep or step.calibrate
                assert (mod.SWEEPS / f"{sweep}.toml").is_file(), (name, sweep)
            else:
                driver = importlib.import_module(step.module)
                assert hasattr(driver, "main"), step.module
                help_text = subprocess.run(
                    [sys.executable, "-m", step.module, "--help"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                assert "--out" in help_text, step.module


def test_list_prints_every_command_and_the_analysis(tmp_path):
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--list", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = res.stdout.splitlines()
    n_steps = sum(len(s) for s in _load().STUDIES.values())
    assert len(lines) == n_steps + 1
    assert lines[-1].startswith("analysis: hpcpipe analyze ")
    assert not list(tmp_path.iterdir())  # --list runs nothing


def test_unknown_study_is_refused_before_any_work(tmp_path):
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", "depth,nope", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert "--only" in res.stderr and "nope" in res.stderr
    assert not (tmp_path / "r").exists()


def test_wall_clock_studies_run_alone_first_and_the_rest_jobs_at_a_time(monkeypatch, tmp_path):
    import threading

    mod = _load()
    spans, lock = {}, threading.Lock()

    def fake(name, steps, out):
        t0 = time.perf_counter()
        time.sleep(0.05)
        with lock:
            spans[name] = (t0, time.perf_counter())
        return {"study": name, "wall_s": 0.05, "cpu_s": 1.0}

    monkeypatch.setattr(mod, "run_study", fake)
    names = list(mod.STUDIES)
    rows = mod.run_all(names, tmp_path, jobs=2)
    assert sorted(r["study"] for r in rows) == sorted(names)
    # a model-clock study of several steps ran as one job per step, and its row sums them
    split = [n for n in names if n not in mod.WALL_CLOCK and len(mod.STUDIES[n]) > 1]
    assert split
    for n in split:
        jobs = [label for label in spans if label.startswith(f"{n}:")]
        assert len(jobs) == len(mod.STUDIES[n]) and n not in spans
        (row,) = [r for r in rows if r["study"] == n]
        assert len(row["parts"]) == len(jobs) and row["cpu_s"] == len(jobs)
    # the jobs started longest first: the two dearest steps began before any other
    order = sorted((span[0], label) for label, span in spans.items() if label not in mod.WALL_CLOCK)
    costs = {label: sum(s.cost for s in steps) for _, label, steps in mod.jobs_of(names)}
    first_two = {label for _, label in order[:2]}
    assert min(costs[lb] for lb in first_two) >= max(
        costs[lb] for lb in costs if lb not in first_two
    )
    wall = [spans[n] for n in mod.WALL_CLOCK]
    rest = [span for label, span in spans.items() if label not in mod.WALL_CLOCK]
    assert wall[0][1] <= wall[1][0]  # one after the other
    assert max(end for _, end in wall) <= min(start for start, _ in rest)  # nothing beside
    events = sorted([(s, 1) for s, _ in rest] + [(e, -1) for _, e in rest])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 2


def test_jobs_below_one_is_refused(tmp_path):
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--jobs", "0", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "--jobs" in res.stderr
    assert not (tmp_path / "r").exists()


def test_timings_hold_the_analysis_and_the_whole_command(monkeypatch, tmp_path):
    """timings.json: each study, then the analysis, the runs and "all" (runs + analysis,
    the figure the README quotes); the analysis's exit status is the script's."""
    import json

    mod = _load()
    rows = [{"study": n, "wall_s": 1.0, "cpu_s": 2.0, "load_start": 0.0, "load_end": 0.0}
            for n in ("lower", "smooth")]  # fmt: skip
    monkeypatch.setattr(mod, "run_all", lambda names, out, jobs: [dict(r) for r in rows])
    popen = subprocess.Popen
    ran = []

    def analysis(argv):
        ran.append(argv)
        work = (  # 0.2 s of CPU, then the exit status of a violated bound
            "import sys, time\nt = time.process_time() + 0.2\n"
            "while time.process_time() < t: pass\nsys.exit(1)"
        )
        return popen([sys.executable, "-c", work])

    monkeypatch.setattr(mod.subprocess, "Popen", analysis)
    out = tmp_path / "r"
    assert (
        mod.main(["--only", "lower,smooth", "--out", str(out), "--report", str(tmp_path / "p")])
        == 1
    )
    assert ran and ran[0][:2] == ["hpcpipe", "analyze"]
    t = {r["study"]: r for r in json.loads((out / "timings.json").read_text())}
    assert list(t) == ["lower", "smooth", "analysis", "runs", "all"]
    assert t["analysis"]["cpu_s"] >= 0.1 and t["runs"]["cpu_s"] == 4.0
    assert t["all"]["cpu_s"] == round(t["runs"]["cpu_s"] + t["analysis"]["cpu_s"], 1)
    assert t["all"]["wall_s"] >= t["runs"]["wall_s"] + t["analysis"]["wall_s"] - 0.1


def test_a_model_clock_job_is_one_process_with_one_blas_thread(tmp_path):
    """Jobs run --jobs at a time, one core each: a driver with --workers 1, a sweep at the
    ranks its points ask for (no --np: never two points side by side), one BLAS thread."""
    mod = _load()
    for n, _, (step,) in mod.jobs_of([n for n in mod.STUDIES if n not in mod.WALL_CLOCK]):
        argv = step.argv(tmp_path)
        if step.module:
            at = argv.index("--workers")
            assert argv[at + 1] == "1", (n, argv)
        else:
            assert "--np" not in argv, (n, argv)
            # an MPI sweep's ranks beyond the cores sleep while they wait, never spin
            sweep = tomllib.loads((mod.SWEEPS / f"{step.sweep}.toml").read_text())
            if sweep["base"].get("executor") == "mpi":
                assert sweep["base"].get("wait") == "sleep", step.sweep
        assert step.cost > 0, n
    assert mod.ENV["OPENBLAS_NUM_THREADS"] == "1" or "OPENBLAS_NUM_THREADS" in os.environ
