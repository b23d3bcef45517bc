"""The dimension study's runs: PPRS on pinball-chain from d = 16 to 65536, γ tuned per d.

pinball-chain (``hpcpipe.problems.worstcase``, τ = 3/4, L = R = 1, f* = 0)
is the instance whose Gaussian smoothing is biased: f(θ_γ*) − f* =
0.2248·γ√d. For each d and seed (each seed is its own instance: target b,
rotations Q and smoothing noise) the run loop runs PPRS (AC-SA's update) on
the simulated pipeline (GPipe, Δ = 2 stages, m = 1, t_F = t_B = 1τ) in the
settings of ``SETTINGS``, all with the plan's T and K (``theory_plan``):

* ``plan``: the plan's γ and η (η = γ/(4L), the step the theorem allows);
* ``c4``, ``c8``, ``c16``: γ = c·γ_plan with η = c·η_plan, the same ratio
  η/γ = 1/(4L): the grid over which γ is tuned per d (with ``plan``, c = 1);
* ``gamma0``: the control without smoothing, at the plan's step;
* ``gamma30``: γ = 30·γ_plan at the plan's step (its bias floor, 1.69ε, is
  above ε).

The two controls run at d <= ``controls_upto`` (1024): their prediction does
not depend on d (γ_plan·√d = ε/4 at every d). The chain's layers are
Householder blocks (``layers = householder``, O(d) each; ``--layers dense``
for d × d blocks, which stop near d = 4096): the 13 dimensions 2⁴ … 2¹⁶.

The points are a sweep (``sweep_text``; the shipped jobs/sweeps/dimension.toml
is its text for the defaults), run here on ``workers`` processes (the points
of one (d, seed) in one process, which composes that instance's chain once);
then MPI spot checks: the same settings at ``spot_dims`` on Δ real ranks
(model clock), ``spot_iterations`` iterations each, in one ``hpcpipe sweep``
launch. A ``fault`` (``depth_runs.FAULTS``) is planted into every point, for
the planted-fault tests.

    python -m hpcpipe.studies.dimension_runs --out results/dimension
    python -m hpcpipe.studies.dimension_runs --write-sweep jobs/sweeps/dimension.toml
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.studies.depth_runs import (
    FAULTS,
    check_points,
    mpi_sweep,
    plant,
    practical,
    run_point,
    save_timings,
)

TAG = "dimension"
FLUSH_EVERY = 1000  # iterations between HDF5 flushes (a run has T <= 1300 at d = 65536)
#: setting -> (γ multiple, η multiple) of the plan's; the first four are the tuning grid
SETTINGS: dict[str, tuple[float, float]] = {
    "plan": (1.0, 1.0),
    "c4": (4.0, 4.0),
    "c8": (8.0, 8.0),
    "c16": (16.0, 16.0),
    "gamma0": (0.0, 1.0),
    "gamma30": (30.0, 1.0),
}
GRID = ("plan", "c4", "c8", "c16")


@dataclass
class DimensionPlan:
    """The study's grid (defaults: the shipped study)."""

    out: str = "results/dimension"
    dims: tuple[int, ...] = tuple(2**e for e in range(4, 17))  # 16 … 65536: 13 dimensions
    eps: float = 0.1
    depth: int = 2
    seeds: tuple[int, ...] = (0, 1, 2)
    settings: tuple[str, ...] = tuple(SETTINGS)
    controls_upto: int = 1024  # gamma0 and gamma30 at d <= this (a d = 4096 run is costly)
    spot_dims: tuple[int, ...] = (16, 64)
    spot_iterations: int = 20
    workers: int = 2
    executor: str = "simulated"
    fault: str = ""
    layers: str = "householder"  # the chain's layers: O(d) Householder blocks, or dense (d²)


def planned(eps: float, L: float, R: float, d: int) -> dict:
    """The PPRS plan as practical settings (L and R rounded to 12 digits: pinball-chain's
    are 1 up to the last bit of ‖b‖, which must not move ⌈·⌉ in T)."""
    return practical("pprs", eps, float(f"{L:.12g}"), float(f"{R:.12g}"), d)


def setting_values(setting: str, eps: float, d: int, L: float = 1.0, R: float = 1.0) -> dict:
    """Run settings of one (setting, d): the plan's T and K, γ and η scaled per ``SETTINGS``."""
    v = planned(eps, L, R, d)
    g, e = SETTINGS[setting]
    v.update(gamma=g * v["gamma"], lr=e * v["lr"])
    return v


def _base(plan: DimensionPlan) -> dict:
    return {
        "problem": "pinball-chain",
        "depth": plan.depth,
        "m": 1,
        "schedule": "gpipe",
        "executor": plan.executor,
        "layers": plan.layers,
        "progress": "off",
        "timeline_limit": 0,
        # few HDF5 flushes: at the default 10, they took 25-40% of a run's CPU at d = 16384
        "flush_every": FLUSH_EVERY,
    }


def cases(plan: DimensionPlan, spot: bool = False) -> list[dict]:
    """One labelled case per (d, setting) (the seeds are the sweep's grid)."""
    out = []
    for d in plan.spot_dims if spot else plan.dims:
        for s in plan.settings:
            if s in ("gamma0", "gamma30") and d > plan.controls_upto:
                continue
            label = f"{'spot-' if spot else ''}d{d}-{s}"
            v = {"label": label, "dim": d, "tag": f"{TAG}/{s}"}
            v.update(setting_values(s, plan.eps, d))
            if spot:
                v.update(tag=f"{TAG}/spot/{s}", executor="mpi", iterations=plan.spot_iterations)
            if plan.fault:
                v = plant(v, plan.fault)
            out.append(v)
    return out


def sweep_text(plan: DimensionPlan, spot: bool = False) -> str:
    """The study's points as a sweep file (TOML): [base], [grid] seed, one case per (d, setting)."""
    name = f"{TAG}-spot" if spot else TAG
    out = str(Path(plan.out) / "spot") if spot else plan.out
    lines = [
        "# The dimension study (generated by python -m hpcpipe.studies.dimension_runs):",
        f"# PPRS on pinball-chain, eps = {plan.eps:g}, d in {list(plan.dims)}, "
        f"Delta = {plan.depth}.",
        "# Per d: the plan (T, K, gamma, eta from theory_plan); gamma = c gamma_plan with",
        "# eta = c eta_plan (c = 4, 8, 16); gamma = 0 and gamma x 30 at the plan's eta "
        f"(d <= {plan.controls_upto}).",
        "[sweep]",
        f"name = {json.dumps(name)}",
        f"out = {json.dumps(out)}",
        f"ranks = {json.dumps('depth' if spot else 1)}",
        "",
        "[base]",
    ]
    base = {**_base(plan), **({"executor": "mpi", "wait": "sleep"} if spot else {})}
    lines += [f"{k} = {json.dumps(v)}" for k, v in base.items()]
    seeds = plan.seeds[:1] if spot else plan.seeds
    lines += ["", "[grid]", f"seed = {json.dumps(list(seeds))}", ""]
    for c in cases(plan, spot):
        lines.append("[[cases]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in c.items()]
        lines.append("")
    return "\n".join(lines)


def _run_group(items: list[tuple[str, dict, str]]) -> list[dict]:
    return [run_point(t) for t in items]


def run_study(plan: DimensionPlan, log=print) -> dict:
    """Run the sweep's points on ``workers`` processes, then the MPI spot checks; timings."""
    from hpcpipe.studies.sweep import SweepLock, load_sweep, write_grid

    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(dataclasses.asdict(plan), indent=1))
    path = out / "sweep.toml"
    path.write_text(sweep_text(plan))
    sweep = load_sweep(path)
    lock = SweepLock(sweep.out, shared=False)
    clock: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        write_grid(sweep)
        groups: dict[tuple, list] = {}
        for p in sweep.points:  # one process per instance: its chain is composed once
            key = (p.values["dim"], p.values["seed"])
            groups.setdefault(key, []).append((p.label, p.values, str(p.path)))
        order = sorted(groups.values(), key=lambda g: -g[0][1]["dim"])  # largest first
        log(f"{len(sweep.points)} simulated runs in {len(order)} groups, {plan.workers} workers")
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core per worker
        done: list[dict] = []

        def finished(got: list[dict]) -> None:  # one progress line per instance
            done.extend(got)
            secs = sum(s["seconds"] or 0 for s in got)
            log(f"  [{len(done)}/{len(sweep.points)}] {got[0]['label']} ...: {secs:.1f} s")

        if plan.workers <= 1:
            for g in order:
                finished(_run_group(g))
        else:
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(plan.workers) as pool:
                for got in pool.imap_unordered(_run_group, order):
                    finished(got)
        ran = [s for s in done if s["seconds"]]
        log(
            f"  ran {len(ran)} ({sum(s['seconds'] for s in ran):.0f} s), skipped complete "
            f"{len(done) - len(ran)}"
        )
    finally:
        lock.release()
    clock["simulated"] = time.perf_counter() - t0
    if plan.spot_dims:
        t1 = time.perf_counter()
        spot = out / "spot-sweep.toml"
        spot.write_text(sweep_text(plan, spot=True))
        mpi_sweep(spot, plan.depth, log)
        clock["mpi"] = time.perf_counter() - t1
    return save_timings(out, clock, t0, log)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def main(argv: list[str] | None = None) -> int:
    d = DimensionPlan()
    p = argparse.ArgumentParser(
        prog="python -m hpcpipe.studies.dimension_runs", description=__doc__
    )
    p.add_argument("--out", default=d.out)
    p.add_argument("--dims", type=_ints, default=d.dims, help="dimensions, comma separated")
    p.add_argument("--eps", type=float, default=d.eps)
    p.add_argument("--seeds", type=_ints, default=d.seeds)
    p.add_argument("--spot-dims", type=_ints, default=d.spot_dims, help="empty: no MPI checks")
    p.add_argument("--spot-iterations", type=int, default=d.spot_iterations)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--fault", default="", choices=("",) + FAULTS)
    p.add_argument(
        "--layers",
        default=d.layers,
        choices=("dense", "householder"),
        help="the chain's orthogonal layers: householder (O(d) each) or dense (d x d each)",
    )
    p.add_argument("--write-sweep", metavar="FILE", help="only write the sweep file")
    a = p.parse_args(argv)
    bad = [x for x in a.dims + a.spot_dims if x < 2]
    if bad or not a.dims or len(a.seeds) < 2 or not a.eps > 0 or a.workers < 1:
        p.error("--dims must be >= 2, --seeds at least two, --eps > 0, --workers >= 1")
    if a.spot_iterations < 1 or min(a.seeds) < 0:
        p.error("--spot-iterations must be >= 1 and --seeds >= 0")
    plan = DimensionPlan(
        out=a.out,
        dims=a.dims,
        eps=a.eps,
        seeds=a.seeds,
        spot_dims=a.spot_dims,
        spot_iterations=a.spot_iterations,
        workers=a.workers,
        fault=a.fault,
        layers=a.layers,
    )
    if a.write_sweep:
        Path(a.write_sweep).write_text(sweep_text(plan))
        return 0
    from hpcpipe.errors import ConfigError

    points = [{**_base(plan), **{k: v for k, v in c.items() if k != "label"}} for c in cases(plan)]
    try:
        check_points(points, plan.workers)
    except (ConfigError, ValueError) as e:
        print(f"dimension_runs: {e}", file=sys.stderr)
        return 2
    run_study(plan, log=functools.partial(print, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
