"""The schedule study's runs: GD's and PPRS's iterations to ε on the depth study's tuned
configurations.

The iterates of a run do not depend on the schedule, nor on Δ for the depth study's
orthogonal chain (``depth_runs``): the simulated executor's arithmetic has no schedule
in it, and a schedule (or a depth) changes only the pipeline time of an iteration
(tested on a small case: ``tests/test_schedule_study.py``). So the study runs each
(x, method) once, at Δ = ``base_depth`` with GPipe, to its first iterate with
f − f* ≤ ε (``stop_at_epsilon``), and ``studies.schedules`` times every built-in
schedule at every depth from these iteration counts with the simulator.

The step factors are the depth study's tuned ones (``depth_runs.tune``: the factor of
its grid that reached ε soonest at Δ = 2), read from its tuning files under
``--depth-out`` when the depth study has run, else run there (the files are then
shared with a later depth study). Each run's file is tagged ``schedules/x=<x>``.

    python -m hpcpipe.studies.schedules_runs --out results/schedules
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpcpipe.studies.depth_runs import DepthPlan, _floats, _run_all, _settings, tune

METHODS = ("gd", "pprs")
TAG = "schedules"


@dataclass
class SchedulePlan:
    """Where the runs go and which configurations (defaults: the shipped study)."""

    out: str = "results/schedules"
    depth_out: str = ""  # the depth study's folder (its tuning files); "": beside ``out``
    xs: tuple[float, ...] = (32.0, 64.0)
    base_depth: int = 4
    workers: int = 2
    factors: dict = field(default_factory=dict)  # (method, x) -> step factor: skips tuning


def depth_plan(plan: SchedulePlan) -> DepthPlan:
    where = plan.depth_out or str(Path(plan.out).parent / "depth-scale")
    return DepthPlan(out=where, xs=plan.xs, methods=METHODS, workers=plan.workers)


def points(plan: SchedulePlan, best: dict) -> list[tuple[str, dict, str]]:
    """(label, run settings, file) per (x, method) at the tuned step."""
    out = []
    for x, opt, _, prac in _settings(depth_plan(plan)):
        v = {
            **prac,
            "depth": plan.base_depth,
            "lr": best[(opt, x)] * prac["lr"],
            "stop_at_epsilon": 1,
            "tag": f"{TAG}/x={x:g}",
        }
        label = f"counts-{opt}-x{x:g}-D{plan.base_depth}"
        out.append((label, v, str(Path(plan.out) / f"{label}.h5")))
    return out


def run_study(plan: SchedulePlan, log=print) -> dict:
    """Tune (or reuse the depth study's tuning), then one run per (x, method)."""
    Path(plan.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    best = dict(plan.factors) or tune(depth_plan(plan), log)
    t1 = time.perf_counter()
    got = _run_all(points(plan, best), plan.workers, log)
    t2 = time.perf_counter()
    log(f"schedule study runs: tuning {t1 - t0:.1f} s, counts {t2 - t1:.1f} s")
    return {"best": best, "runs": got}


def main(argv: list[str] | None = None) -> int:
    d = SchedulePlan()
    p = argparse.ArgumentParser(
        prog="python -m hpcpipe.studies.schedules_runs", description=__doc__
    )
    p.add_argument("--out", default=d.out)
    p.add_argument(
        "--depth-out", default=d.depth_out, help="the depth study's folder (default: beside --out)"
    )
    p.add_argument("--xs", type=_floats, default=d.xs, help="RL/eps values, comma separated")
    p.add_argument("--base-depth", type=int, default=d.base_depth)
    p.add_argument("--workers", type=int, default=d.workers)
    a = p.parse_args(argv)
    if a.base_depth < 1 or a.workers < 1 or any(not x > 8 for x in a.xs):
        print("schedules_runs: --base-depth and --workers must be >= 1 and every x > 8")
        return 2
    plan = SchedulePlan(a.out, a.depth_out, tuple(a.xs), a.base_depth, a.workers)
    run_study(plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
