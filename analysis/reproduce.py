"""Reproduce every study of the report: run its sweeps and drivers, then ``hpcpipe analyze``.

    python analysis/reproduce.py                      # all studies into results/, report/
    python analysis/reproduce.py --only depth,lower   # some of them
    python analysis/reproduce.py --list               # the commands, without running them

Each study is a list of steps (``hpcpipe sweep`` of a file under ``jobs/sweeps/``, or a
study's own driver module); a step whose results are complete is skipped by the sweep
itself, so an interrupted reproduction resumes where it stopped. A model-clock step is a
job of one process: its sweep runs one point at a time (the MPI spot checks launch their
Δ ranks, oversubscribed by design, idle ranks asleep) and a driver runs with
``--workers 1``, one BLAS thread each, so that ``--jobs`` jobs keep as many processes busy
as the machine has cores: oversubscribed, the same work costs more CPU (each run's
``timings.json`` holds every job's wall and CPU seconds). A point's file does not
depend on the process that runs it.

The studies judged in seconds (``WALL_CLOCK``: their wall-clock rows need a quiet
machine) run first, one at a time, with nothing beside them. The others are judged on
the model clock, whose figures do not depend on the load: each of their independent
steps is a job, and the jobs run ``--jobs`` at a time (default 2, this machine's cores),
longest first (``Step.cost``), so that no core waits while work is left. For each study
and for the analysis, the wall time, the CPU time of its processes (user + sys of each
step and what it waited for, from ``wait4``) and the load average at its start and end
are printed and written to ``<out>/timings.json`` with the runs' wall time (``runs``)
and the whole command's (``all``: runs and analysis), so the run time a README quotes is
measured, with the load it was measured at.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "jobs" / "sweeps"


@dataclass(frozen=True)
class Step:
    """One command of a study; ``sweep`` names a file under jobs/sweeps/, else ``module``;
    ``calibrate`` names a sweep file whose missing machine profiles are calibrated."""

    sweep: str = ""
    module: str = ""
    cost: float = 0.0  # CPU seconds alone, from a stored run: the jobs start longest first
    calibrate: str = ""
    args: tuple[str, ...] = ()  # further arguments of a driver module
    folder: str = ""  # the results folder under --out (default: the driver's study name)

    @property
    def folder_name(self) -> str:
        """Its results folder under --out ("" for a calibration, which writes none)."""
        if self.calibrate:
            return ""
        return self.sweep or self.folder or self.module.rsplit(".", 1)[-1].removesuffix("_runs")

    def argv(self, out: Path) -> list[str]:
        if self.calibrate:
            return ["hpcpipe", "calibrate", "--sweep", str(SWEEPS / f"{self.calibrate}.toml")]
        name = self.folder_name
        if self.sweep:
            # no --np: each point on the ranks it asks for, one point at a time (module doc)
            return ["hpcpipe", "sweep", str(SWEEPS / f"{name}.toml"), "--out", str(out / name)]
        return [sys.executable, "-m", self.module, "--out", str(out / name), *self.args]


ONE = ("--workers", "1")  # a driver's runs in its own process: one job, one core

# the depth study's asymptotic regime: x = RL/eps = 128 and 256 (d = 1024, 4096) on
# Householder layers, deep points on the reduced route (hpcpipe.pipeline.reduced)
DEPTH_ASYMPTOTIC = Step(
    module="hpcpipe.studies.depth_runs",
    folder="depth-asymptotic",
    args=("--xs", "128,256", "--depths", "2,64,512,4096", "--spot-depths", "2", *ONE),
    cost=532,
)


# The report's studies (hpcpipe.studies.report.STUDIES) and the steps that make their
# results. A model-clock step's ``cost`` orders the jobs only (longest first): its CPU
# seconds in a run of this arrangement on the 2-core development machine (2026-12-06).
STUDIES: dict[str, list[Step]] = {
    # its wall-clock runs are held to a profile per depth, calibrated first
    "pipeline-time": [Step(calibrate="pipeline-time"), Step(sweep="pipeline-time")],
    # one profile per depth (a profile holds one rank count), at the paths the sweep names
    "depth-wall": [Step(calibrate="depth-wall"), Step(sweep="depth-wall")],
    # the model-clock studies: every step writes its own folder and reads no other's
    "depth": [Step(module="hpcpipe.studies.depth_runs", args=ONE, cost=84), DEPTH_ASYMPTOTIC],
    "paper": [
        Step(sweep="paper", cost=137),
        Step(sweep="paper-gamma", cost=19),
        Step(sweep="paper-fewshot", cost=41),
        Step(sweep="paper-fgsm", cost=9),
        Step(sweep="paper-mpi", cost=54),
    ],
    "dimension": [Step(module="hpcpipe.studies.dimension_runs", args=ONE, cost=175)],
    "lower": [Step(sweep="lower", cost=51), Step(sweep="lower-mpi", cost=21)],
    "nonconvex": [Step(sweep="nonconvex", cost=17), Step(sweep="nonconvex-mpi", cost=32)],
    "smooth": [Step(sweep="smooth", cost=41), Step(sweep="smooth-worstcase", cost=6)],
    "schedules": [Step(module="hpcpipe.studies.schedules_runs", args=ONE, cost=5)],
}


# studies with rows judged in seconds on this machine: run alone, before the others
WALL_CLOCK = ("pipeline-time", "depth-wall")


def jobs_of(names: list[str]) -> list[tuple[str, str, list[Step]]]:
    """The model-clock studies' jobs, longest first: (study, label, steps), one job per
    step (its label ``study:folder`` when the study has several)."""
    jobs = []
    for n in names:
        steps = STUDIES[n]
        for s in steps:
            jobs.append((n, n if len(steps) == 1 else f"{n}:{s.folder_name}", [s]))
    return sorted(jobs, key=lambda j: -sum(s.cost for s in j[2]))


# one BLAS thread per process (unless set): a job is one process on one core
ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **os.environ}


def _load() -> float:
    return os.getloadavg()[0]


def _wait(proc: subprocess.Popen) -> float:
    """Wait for a step; its CPU seconds (user + sys, with the processes it waited for)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def run_study(name: str, steps: list[Step], out: Path) -> dict:
    """Run a study's steps; its wall time, CPU time and load; raises on a failed step."""
    t0, cpu, l0 = time.perf_counter(), 0.0, _load()
    for step in steps:
        argv = step.argv(out)
        print(f"[{name}] {shlex.join(argv)}", flush=True)
        proc = subprocess.Popen(argv, env=ENV)
        cpu += _wait(proc)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv)
    r = {
        "study": name,
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(cpu, 1),
        "load_start": round(l0, 2),
        "load_end": round(_load(), 2),
    }
    print(
        f"[{name}] done: {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU, "
        f"load {r['load_start']:.1f} -> {r['load_end']:.1f}",
        flush=True,
    )
    return r


def _timed(name: str, steps: list[Step], out: Path) -> tuple[dict, float, float]:
    """``run_study`` with the perf_counter seconds at its start and end."""
    t0 = time.perf_counter()
    row = run_study(name, steps, out)
    return row, t0, time.perf_counter()


def _merged(name: str, parts: list[tuple[dict, float, float]]) -> dict:
    """One row for a study run as several jobs: its wall time from the first job's start
    to the last one's end, the sum of their CPU, the load at those two moments, and
    each job's own row under ``parts``."""
    if len(parts) == 1:
        return parts[0][0]
    first = min(parts, key=lambda p: p[1])
    last = max(parts, key=lambda p: p[2])
    return {
        "study": name,
        "wall_s": round(last[2] - first[1], 1),
        "cpu_s": round(sum(p[0]["cpu_s"] for p in parts), 1),
        "load_start": first[0].get("load_start"),
        "load_end": last[0].get("load_end"),
        "parts": [p[0] for p in parts],
    }


def run_all(names: list[str], out: Path, jobs: int) -> list[dict]:
    """The wall-clock studies one by one, then the others' jobs (``jobs_of``) ``jobs`` at
    a time (module doc); one row per study (``_merged``)."""
    rows = [run_study(n, STUDIES[n], out) for n in names if n in WALL_CLOCK]
    rest = [n for n in names if n not in WALL_CLOCK]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [(n, pool.submit(_timed, label, steps, out)) for n, label, steps in jobs_of(rest)]
        done = [(n, f.result()) for n, f in futures]  # the first failure, once all ended
    return rows + [_merged(n, [p for m, p in done if m == n]) for n in rest]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results", help="results folder (default: results)")
    parser.add_argument("--report", default="report", help="report folder (default: report)")
    parser.add_argument("--only", default="", help="comma-separated study names")
    parser.add_argument("--list", action="store_true", help="print the commands and stop")
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="model-clock studies run at a time (default 2); the wall-clock studies "
        f"({', '.join(WALL_CLOCK)}) always run alone, first",
    )
    args = parser.parse_args(argv)

    names = [n for n in args.only.split(",") if n] or list(STUDIES)
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        print(
            f"error: --only: unknown study {', '.join(unknown)}; choose from {', '.join(STUDIES)}",
            file=sys.stderr,
        )
        return 2
    if args.jobs < 1:
        print(f"error: --jobs must be >= 1 (got {args.jobs})", file=sys.stderr)
        return 2
    out, report = Path(args.out), Path(args.report)
    analyze = ["hpcpipe", "analyze", str(out), "-o", str(report)]
    analyze += [a for n in names for a in ("--study", n)] if args.only else []
    if args.list:
        for n in names:
            for step in STUDIES[n]:
                print(f"{n}: {shlex.join(step.argv(out))}")
        print(f"analysis: {shlex.join(analyze)}")
        return 0

    t0 = time.perf_counter()
    rows = run_all(names, out, args.jobs)
    runs = {"study": "runs", "wall_s": round(time.perf_counter() - t0, 1)}
    runs["cpu_s"] = round(sum(r["cpu_s"] for r in rows), 1)
    print(f"analysis: {shlex.join(analyze)}", flush=True)
    t1, l1 = time.perf_counter(), _load()
    proc = subprocess.Popen(analyze)
    cpu = _wait(proc)
    analysis = {
        "study": "analysis",
        "wall_s": round(time.perf_counter() - t1, 1),
        "cpu_s": round(cpu, 1),
        "load_start": round(l1, 2),
        "load_end": round(_load(), 2),
    }
    total = {
        "study": "all",
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(runs["cpu_s"] + cpu, 1),
        "jobs": args.jobs,
    }
    out.mkdir(parents=True, exist_ok=True)
    rows += [analysis]
    (out / "timings.json").write_text(json.dumps(rows + [runs, total], indent=1) + "\n")
    print(f"{'study':<14} {'wall (s)':>9} {'CPU (s)':>8}  load")
    for r in rows:
        print(
            f"{r['study']:<14} {r['wall_s']:>9.0f} {r['cpu_s']:>8.0f}  "
            f"{r['load_start']:.1f} -> {r['load_end']:.1f}"
        )
    for r in (runs, total):
        print(f"{r['study']:<14} {r['wall_s']:>9.0f} {r['cpu_s']:>8.0f}")
    # exit 1 when a bound is violated, as hpcpipe analyze does
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
