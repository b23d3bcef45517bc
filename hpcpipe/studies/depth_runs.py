"""The depth study's runs: GD, AGD and PPRS from Δ = 2 to thousands on the simulated pipeline.

The instance is ``nesterov-chain`` (``problems.worstcase``): the regime of the
claim needs GD to pay (RL/ε)² iterations, and on it every method whose
iterates stay in the span of the subgradients it has seen needs at least
k iterations for ε < 1/(2√k), while GD at its theory step needs at most
(RL/ε)². For each x = RL/ε the chain length is k = ⌊x²/16⌋
(``hard_chain_length``: f(θ₀) − f* = 1/(2√k) ≥ 2/x > ε = RL/x for x > 8),
and the dimension is d = k, the smallest that holds the chain: d ≥ k is
needed, and PPRS's plan grows with d^(1/4) (T = ⌈8LR d^(1/4)/ε⌉), so a
larger d would only lengthen PPRS's plan without making GD's task harder
(coordinates beyond k are untouched by the max). With d = k = x²/16 the
plans are T_GD = x², T_PPRS = 4x^(3/2), K ≈ (8/3)√x, and the bounds'
GD/PPRS time ratio T_GD·Δ/(T_PPRS(K + Δ − 1)) exceeds 1 from Δ ≈ 36
(x = 32) and 21 (x = 64); at x = 16 the two plans are equal (never).

For each x, each method and each depth Δ, one run of the run loop on the
simulated executor (one stage per layer, GPipe, m = 1, t_F = t_B = 1τ, no
timeline), written as a result file:

* ``theory``: the method at its theory settings (``mode = "theory"``);
* ``tuned``: the same T (and γ, K) with the step η scaled by the factor of
  ``factors`` that reached ε soonest at depth ``tune_depth`` (the iterations
  on an orthogonal chain do not depend on Δ, so one tuning serves all
  depths; the tuning runs are kept, tagged ``depth/tune``, each stopped at the best
  time to ε of the runs before it, ``run_tuning``);
* ``spot``: MPI spot checks: the theory configurations at Δ in
  ``spot_depths`` on Δ real ranks (model clock) for ``spot_iterations``
  iterations, launched as one ``hpcpipe sweep``; the analysis compares them
  with the simulated runs (consistency, not a claim).

A ``fault`` plants a wrong PPRS for the planted-fault tests: ``k1`` (K = 1),
``gamma30`` (γ × 30), ``no-momentum``, ``step4`` (η × 4) or
``depth-per-sample`` (a pipeline that pays the depth once per sample: the
sequential schedule). Runs go to ``workers`` processes, each with one BLAS
thread (on a shared machine several BLAS threads per process make the
d×d QR factorisations of the chain tens of times slower); each writes its
own file, so an interrupted study resumes by skipping the complete ones.

``layers`` (``--layers``) chooses the chain's orthogonal layers: ``dense`` (the
shipped study) or ``householder`` (O(d) each, ``layers.Householder``), which
keeps a chain of Δ = 4096 at d = 4096 in 260 MiB where dense layers would need
512 GiB. A run's numerics then cost about 8·rΔ·d flops per row and iteration
(r = 2; K + 1 rows: the K samples and the exact f), so at Δ = 4096 a run costs
in proportion to Δ·d·K·T: check a small slice before a large x. Every point's
settings and the memory of ``workers`` points at once are checked before any
work starts (``check_points``).

    python -m hpcpipe.studies.depth_runs --out results/depth-scale
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import multiprocessing
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpcpipe.optim.methods import theory_plan
from hpcpipe.problems.worstcase import hard_chain_length

METHODS = ("gd", "agd", "pprs")
FAULTS = ("k1", "gamma30", "no-momentum", "step4", "depth-per-sample")
TAG = "depth"
DENSE_UP_TO = 256  # layers = auto: dense layers up to this d (the shipped grid), householder above
REDUCE_ABOVE = 8  # Householder points with depth above it run on the reduced route
NO_TIMELINE = 10**9  # timeline_every above any T: the study keeps no per-action timeline
# iterations between HDF5 flushes: a point whose file is unfinished runs again from the start
# (``_kept_summary``), so a flush before the end saves nothing a resume would use; it only
# bounds the rows held in memory (at 500, the flushes took 11% of a run of x = 128 points)
FLUSH_EVERY = 100_000


@dataclass
class DepthPlan:
    """The study's grid (defaults: the shipped study)."""

    out: str = "results/depth-scale"
    problem: str = "nesterov-chain"
    dim: int = 0  # 0: d = k = ⌊x²/16⌋ per x (nesterov-chain only)
    xs: tuple[float, ...] = (16.0, 32.0, 64.0)
    depths: tuple[int, ...] = (2, 4, 8, 32, 128, 512, 2048)
    methods: tuple[str, ...] = METHODS
    factors: tuple[float, ...] = (1 / 16, 0.25, 1.0, 4.0, 16.0, 64.0, 256.0)
    tune_depth: int = 2
    tuned: bool = True
    spot_depths: tuple[int, ...] = (2, 4, 8)
    spot_iterations: int = 20
    workers: int = 2
    fault: str = ""
    seed: int = 0
    layers: str = "auto"  # the chain's layers: dense, householder (O(d)) or auto (by d)
    reduce_above: int = REDUCE_ABOVE  # Householder points deeper than this: executor reduced
    extra: dict = field(default_factory=dict)  # further run settings for every point


def dim_for(plan: DepthPlan, x: float) -> int:
    """d at x = RL/ε: ``plan.dim``, or for nesterov-chain with ``dim = 0`` the chain length
    k = ⌊x²/16⌋ (``hard_chain_length(1/x)``; ε = RL/x ≥ 1/x since R = 1, L > 1)."""
    if plan.dim > 0:
        return plan.dim
    if plan.problem != "nesterov-chain":
        raise ValueError(f"dim = 0 (d from x) is for nesterov-chain, not {plan.problem!r}")
    return hard_chain_length(1.0 / x)


def layers_for(plan: DepthPlan, x: float) -> str:
    """The chain's layer type at x: ``plan.layers``, or for ``auto`` dense up to
    d = DENSE_UP_TO (the shipped grid, x <= 64) and householder above (x = 128: d = 1024)."""
    if plan.layers != "auto":
        return plan.layers
    return "dense" if dim_for(plan, x) <= DENSE_UP_TO else "householder"


def executor_for(values: dict, plan: DepthPlan) -> str:
    """``reduced`` for a Householder point deeper than ``plan.reduce_above`` (the reduced
    route, ``pipeline.reduced``: timed at its depth, computed on the chain's first Δ₀ =
    ``REDUCED_DEPTH`` blocks) and for the point at Δ₀ itself (where the reduced pipeline
    computes exactly the full run, bitwise: its calls then serve the deeper points),
    else ``simulated``."""
    from hpcpipe.pipeline.reduced import REDUCED_DEPTH

    if plan.reduce_above < 0 or values.get("layers") != "householder":
        return "simulated"
    depth = int(values["depth"])
    return "reduced" if depth > plan.reduce_above or depth == REDUCED_DEPTH else "simulated"


def _base(plan: DepthPlan, x: float) -> dict:
    return {
        "problem": plan.problem,
        "layers": layers_for(plan, x),
        "dim": dim_for(plan, x),
        "m": 1,
        "schedule": "gpipe",
        "executor": "simulated",
        "progress": "off",
        "seed": plan.seed,
        "timeline_limit": 0,
        "timeline_every": NO_TIMELINE,
        "flush_every": FLUSH_EVERY,
        **plan.extra,
    }


def constants(plan: DepthPlan, x: float) -> tuple[float, float, int]:
    """(L, R, d) of the study's problem at x, from a depth-1 instance (they do not depend
    on Δ)."""
    from mpi4py import MPI

    from hpcpipe.run.config import make_config
    from hpcpipe.run.runner import make_problem

    cfg = make_config({**_base(plan, x), "depth": 1, "mode": "practical"})
    prob = make_problem(cfg, MPI.COMM_SELF)
    return float(prob.L), float(prob.R), int(prob.dim)


def practical(opt: str, eps: float, L: float, R: float, d: int) -> dict:
    """The theory plan written as practical settings (to scale its step or plant a fault)."""
    plan = theory_plan(opt, eps, L, R, d)
    m = plan.method
    # AGD's and PPRS's momentum rule (GD has none)
    momentum = {"momentum": str(m.momentum)} if hasattr(m, "momentum") else {}
    return {
        "optimizer": opt,
        "mode": "practical",
        "lr": m.lr,
        **momentum,
        "gamma": m.gamma,
        "samples": m.samples,
        "iterations": plan.iterations,
        "epsilon": eps,
    }


def plant(values: dict, fault: str) -> dict:
    """A PPRS configuration with a planted fault (see the module docstring)."""
    v = dict(values)
    if fault == "k1":
        v["samples"] = 1
    elif fault == "gamma30":
        v["gamma"] = 30 * v["gamma"]
    elif fault == "no-momentum":
        v["momentum"] = "0"
    elif fault == "step4":
        v["lr"] = 4 * v["lr"]
    elif fault == "depth-per-sample":
        v["schedule"] = "sequential"
    else:
        raise ValueError(f"fault {fault!r}: choose one of {', '.join(FAULTS)}")
    return v


def _label(setting: str, opt: str, x: float, depth: int, extra: str = "") -> str:
    return f"{setting}-{opt}-x{x:g}-D{depth}" + (f"-{extra}" if extra else "")


def _settings(plan: DepthPlan):
    """Per (x, method): x, the method, ε = RL/x and a fresh copy of its practical run
    settings (``_base`` + ``practical``) for the caller to complete."""
    for x in plan.xs:
        L, R, d = constants(plan, x)
        eps = R * L / x
        for opt in plan.methods:
            yield x, opt, eps, {**_base(plan, x), **practical(opt, eps, L, R, d)}


def theory_points(plan: DepthPlan) -> list[tuple[str, dict]]:
    pts = []
    for x, opt, eps, prac in _settings(plan):
        for depth in plan.depths:
            v = {**_base(plan, x), "depth": depth, "tag": f"{TAG}/theory"}
            if plan.fault and opt == "pprs":
                v.update(plant({**prac, **v}, plan.fault))
            else:
                v.update(optimizer=opt, mode="theory", epsilon=eps)
            v["executor"] = executor_for(v, plan)
            pts.append((_label("theory", opt, x, depth), v))
    return pts


def check_points(values: list[dict], workers: int) -> None:
    """Validate every point's settings before any work starts (ConfigError: one line naming
    the field and the fix), and the memory of ``workers`` of the largest at once.

    Each worker holds one point's problem, so the study needs about
    min(workers, points) × the largest point's estimate (``run.resources``)."""
    from hpcpipe.errors import ConfigError
    from hpcpipe.run import resources
    from hpcpipe.run.config import make_config

    worst, worst_cfg = 0, None
    for v in values:
        cfg = make_config(v)
        total = sum(b for b, _ in resources.estimate(cfg).values())
        if total > worst:
            worst, worst_cfg = total, cfg
    n = min(max(workers, 1), len(values))
    if worst_cfg is None or n <= 1:
        return
    limit, source = resources.limit_bytes()
    if n * worst > limit:
        parts = resources.estimate(worst_cfg)
        big, (b, why) = max(parts.items(), key=lambda kv: kv[1][0])
        gib = resources.GiB
        fix = " or --layers householder" if worst_cfg.layers == "dense" else ""
        raise ConfigError(
            f"{why}: {n} workers need about {n * worst / gib:.3g} GiB of memory "
            f"({worst / gib:.3g} GiB each; {big}: {b / gib:.3g} GiB), more than the "
            f"{limit / gib:.3g} GiB of {source}; use fewer --workers, smaller sizes{fix}"
        )


def all_points(plan: DepthPlan) -> list[dict]:
    """Every simulated point's settings at its largest (theory and tuned points differ from
    these only in the step; the faults' in what they plant)."""
    pts = []
    for _, opt, _, prac in _settings(plan):
        for depth in plan.depths:
            v = {**prac, "depth": depth}
            v["executor"] = executor_for(v, plan)
            pts.append(plant(v, plan.fault) if plan.fault and opt == "pprs" else v)
    return pts


def run_point(item: tuple[str, dict, str]) -> dict:
    """Run one point into its file (skipped when the file is complete), with one BLAS
    thread; its summary."""
    label, values, path = item
    with one_blas_thread():
        return _run_point(label, values, Path(path))


def one_blas_thread():
    """``threadpool_limits(1)`` over every BLAS a run uses, scipy's own OpenBLAS included.

    threadpoolctl limits only the libraries loaded when it is entered, and scipy ships
    an OpenBLAS of its own, loaded by the first import of ``scipy.linalg`` (the dense
    chain's QR, ``simulated._times_block``). Imported inside the limit, it kept its
    default threads, which spin while they wait: the same bits (checked on a chain of
    512 blocks of 256 × 256) for 2.6 times the CPU of one thread, and in the full
    reproduction, beside another study, theory-gd-x64-D2048 took 345 s instead of 16 s.
    So scipy.linalg is loaded first, then limited with the rest."""
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS, see above)
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1)


def run_group(group: list[tuple[str, dict, str]]) -> list[dict]:
    """Run a group of points in this process: in order (``run_point`` each), or the
    reduced points of one (setting, method, x) side by side (``run_side_by_side``)."""
    from hpcpipe.pipeline.reduced import clear_memo

    clear_memo()
    try:
        if len(group) > 1 and all(v.get("executor") == "reduced" for _, v, _ in group):
            return run_side_by_side(group)
        return [run_point(item) for item in group]
    finally:
        clear_memo()


def run_side_by_side(group: list[tuple[str, dict, str]]) -> list[dict]:
    """The reduced points of one group, iteration by iteration (``runner.run_together``),
    with one BLAS thread; their summaries.

    Their calls do not depend on the depth (``pipeline.reduced``): the first point's
    call t is kept and serves the deeper points' call t, then is forgotten, so each call
    is computed once and the kept answers never outgrow one iteration. The group's
    seconds are reported on its first point (the others show none: they ran beside it).
    Points whose files are complete are skipped, as ``run_point`` does."""
    from mpi4py import MPI

    from hpcpipe.pipeline.reduced import clear_memo
    from hpcpipe.run.config import make_config
    from hpcpipe.run.runner import run_together

    out, todo = {}, []
    for label, values, path in group:
        kept = _kept_summary(label, values, Path(path))
        if kept is not None:
            out[label] = kept
        else:
            todo.append((label, values, path))
    if todo:
        t0 = time.perf_counter()
        cfgs = [make_config({**v, "output": p}) for _, v, p in todo]
        with one_blas_thread():
            results = run_together(
                cfgs, MPI.COMM_SELF, [lb for lb, _, _ in todo], between=clear_memo
            )
        seconds = time.perf_counter() - t0
        for i, ((label, values, _), res) in enumerate(zip(todo, results)):
            it = {c: res.column(c) for c in ("iteration", "gap", "pipeline_time")}
            out[label] = _summary(label, it, values, seconds if i == 0 else 0.0)
        if len(todo) > 1:
            out[todo[0][0]]["note"] = f" (with {len(todo) - 1} deeper point(s) beside it)"
    return [out[label] for label, _, _ in group]


SHARED_CHAIN_DEPTH = 128  # dense points this deep share one process per chain (groups_of)


def groups_of(items: list[tuple[str, dict, str]]) -> list[list[tuple[str, dict, str]]]:
    """The points in groups, each group run in one process (``run_group``):

    * a reduced point: one group per (tag, method, x, settings but the depth), shallowest
      first (the point at Δ₀ computes the calls the deeper ones reuse);
    * a dense simulated point at depth >= SHARED_CHAIN_DEPTH: one group per chain
      (problem, d, seed), deepest first. Building Q = Q₁⋯Q_Δ costs Δ QR factorisations
      of d × d (``simulated.builtin_chain_matrix``) and the process keeps its prefixes,
      so the deepest point builds the chain once and the others reuse it, where two
      workers would each build it (x = 64: 2048 blocks of 256 × 256);
    * any other point: a group of its own.
    """
    out, reduced, chains = [], {}, {}
    for item in items:
        v = item[1]
        if v.get("executor") == "reduced":
            key = json.dumps({k: w for k, w in v.items() if k != "depth"}, sort_keys=True)
            reduced.setdefault(key, []).append(item)
        elif v.get("layers") == "dense" and int(v.get("depth", 1)) >= SHARED_CHAIN_DEPTH:
            key = json.dumps([v.get("problem"), v.get("dim"), v.get("seed")])
            chains.setdefault(key, []).append(item)
        else:
            out.append([item])
    out += [sorted(g, key=lambda t: -int(t[1]["depth"])) for g in chains.values()]
    return out + [sorted(g, key=lambda t: int(t[1]["depth"])) for g in reduced.values()]


def _run_point(label: str, values: dict, p: Path) -> dict:
    from mpi4py import MPI

    from hpcpipe.run.config import make_config
    from hpcpipe.run.runner import run

    t0 = time.perf_counter()
    kept = _kept_summary(label, values, p)
    if kept is not None:
        return kept
    cfg = make_config({**values, "output": str(p)})
    res = run(cfg, MPI.COMM_SELF, label=label)
    it = {c: res.column(c) for c in ("iteration", "gap", "pipeline_time")}
    return _summary(label, it, values, time.perf_counter() - t0)


def _kept_summary(label: str, values: dict, p: Path) -> dict | None:
    """The summary of a point whose file is complete (or diverged); None when it must run
    (a missing, unfinished or unreadable file, which is removed)."""
    from hpcpipe.run.results import ResultsError, load

    if not p.exists():
        return None
    try:
        r = load(p)
        if r.status in ("complete", "diverged"):
            return _summary(label, r.iterations, values, 0.0)
    except ResultsError:
        pass
    p.unlink()
    return None


def _summary(label: str, it: dict, values: dict, seconds: float) -> dict:
    """Iterations and pipeline time at the first iterate with f − f* <= ε."""
    import numpy as np

    gap = np.asarray(it["gap"])
    hit = np.flatnonzero(np.isfinite(gap) & (gap <= values["epsilon"]))
    first = int(hit[0]) if hit.size else -1
    return {
        "label": label,
        "iterations": float(it["iteration"][first]) if first >= 0 else math.nan,
        "time": float(it["pipeline_time"][first]) if first >= 0 else math.nan,
        "seconds": seconds,
    }


def _run_all(items: list[tuple[str, dict, str]], workers: int, log) -> list[dict]:
    """Run the points (grouped by ``groups_of``) on ``workers`` processes."""
    return _run_groups(groups_of(items), run_group, workers, log)


def _run_groups(groups: list[list], runner, workers: int, log) -> list[dict]:
    """Run each group with ``runner`` (longest first) on ``workers`` processes; one
    progress line per finished point: its count, its label and its seconds."""
    items = [item for g in groups for item in g]
    groups = sorted(groups, key=lambda g: -_cost(g[0][1]))  # longest first
    out: list[dict] = []

    def done(got: list[dict]) -> None:
        for s in got:
            out.append(s)
            if s["seconds"]:
                note = s.get("note", "")
                log(f"  [{len(out)}/{len(items)}] {s['label']}: {s['seconds']:.1f} s{note}")

    if workers <= 1:
        for g in groups:
            done(runner(g))
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers) as pool:
            for got in pool.imap_unordered(runner, groups):
                done(got)
    return out


def _cost(v: dict) -> float:
    """A rough work estimate of a point or a reduced group (for ordering only): the
    numerics' depth times d^(3/2) (T·K grows like x^(3/2)·√x at d = x²/16)."""
    depth = 2 if v.get("executor") == "reduced" else float(v.get("depth", 1))
    return depth * float(v.get("dim", 1)) ** 1.5


def run_tuning(group: list[tuple[str, dict, str]]) -> list[dict]:
    """One (method, x)'s tuning runs in order, each stopped when its pipeline time reaches
    the best time to ε of the runs before it (``time_budget``).

    The tuning keeps the factor with the least time to ε, so a run that has not reached ε
    by the best time so far cannot win: stopping it there (a run that reaches ε exactly at
    the budget still records it) leaves the choice that of the full runs, and a step that
    never reaches ε costs the best run's time instead of its whole plan. Its file is then
    a run stopped by its budget (``time_budget`` in its settings)."""
    best, out = math.inf, []
    for label, values, path in group:
        v = {**values, "time_budget": best} if math.isfinite(best) else values
        out.append(run_point((label, v, path)))
        best = min(best, out[-1]["time"]) if math.isfinite(out[-1]["time"]) else best
    return out


def tuning_order(factors: tuple[float, ...]) -> list[float]:
    """The order of a tuning's runs: the theory step (1), the larger steps upwards, then
    the smaller ones downwards, so that the best time so far, and with it each later run's
    budget, falls early whether the best step is above the theory step (PPRS) or not."""
    return sorted(factors, key=lambda c: (c != 1.0, c < 1.0, c if c >= 1.0 else -c))


def tune(plan: DepthPlan, log) -> dict:
    """Per (method, x): the step factor with the smallest time to ε at ``tune_depth``
    (in ``tuning_order``, each run stopped at the best time so far: ``run_tuning``)."""
    out = Path(plan.out)
    groups = []
    for x, opt, _, prac in _settings(plan):
        group = []
        for c in tuning_order(plan.factors):
            v = {**prac, "depth": plan.tune_depth, "lr": c * prac["lr"], "tag": f"{TAG}/tune"}
            v["stop_at_epsilon"] = 1  # the score is the time to ε: nothing after it counts
            label = _label("tune", opt, x, plan.tune_depth, f"c{c:g}")
            group.append((label, v, str(out / "tune" / f"{label}.h5")))
        groups.append(group)
    got = {s["label"]: s for s in _run_groups(groups, run_tuning, plan.workers, log)}
    best = {}
    for x in plan.xs:
        for opt in plan.methods:
            scores = [
                (got[_label("tune", opt, x, plan.tune_depth, f"c{c:g}")]["time"], c)
                for c in plan.factors
            ]
            reached = [(t, c) for t, c in scores if math.isfinite(t)]
            best[(opt, x)] = min(reached)[1] if reached else 1.0
    return best


def tuned_points(plan: DepthPlan, best: dict) -> list[tuple[str, dict]]:
    pts = []
    for x, opt, _, prac in _settings(plan):
        lr = best[(opt, x)] * prac["lr"]
        for depth in plan.depths:
            v = {**prac, "depth": depth, "lr": lr, "tag": f"{TAG}/tuned"}
            v["executor"] = executor_for(v, plan)
            pts.append((_label("tuned", opt, x, depth), v))
    return pts


def spot_depths(plan: DepthPlan) -> list[int]:
    """The spot-check depths that have a simulated partner in the grid (the others would
    compare with nothing)."""
    return [D for D in plan.spot_depths if D in plan.depths]


def spot_sweep(plan: DepthPlan) -> Path:
    """The MPI spot checks as a sweep file (executor = mpi, Δ ranks, model clock)."""
    out = Path(plan.out)
    cases = []
    for x, opt, _, prac in _settings(plan):
        for depth in spot_depths(plan):
            v = {**prac, "depth": depth, "tag": f"{TAG}/spot", "executor": "mpi"}
            v.update(wait="sleep", iterations=plan.spot_iterations)
            if plan.fault and opt == "pprs":
                v = plant(v, plan.fault)
            cases.append({"label": _label("spot", opt, x, depth), **v})
    path = out / "spot-sweep.toml"
    lines = [
        "# MPI spot checks of the depth study (generated by hpcpipe.studies.depth_runs)",
        "[sweep]",
        'name = "depth-spot"',
        f"out = {json.dumps(str(out / 'spot'))}",
        'ranks = "depth"',
        "",
    ]
    for c in cases:
        lines.append("[[cases]]")
        lines += [f"{k} = {json.dumps(w)}" for k, w in c.items()]
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def run_study(plan: DepthPlan, log=print) -> dict:
    """Tune, run the grid on the simulated pipeline, run the MPI spot checks; timings."""
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(dataclasses.asdict(plan), indent=1))
    clock = {}
    t0 = time.perf_counter()
    items = [(lb, v, str(out / "theory" / f"{lb}.h5")) for lb, v in theory_points(plan)]
    if plan.tuned and not plan.fault:
        log(f"tuning the step at depth {plan.tune_depth} ({len(plan.factors)} factors)")
        best = tune(plan, log)
        (out / "tuned-factors.json").write_text(
            json.dumps({f"{o} x={x:g}": c for (o, x), c in best.items()}, indent=1)
        )
        items += [(lb, v, str(out / "tuned" / f"{lb}.h5")) for lb, v in tuned_points(plan, best)]
        clock["tune"] = time.perf_counter() - t0
    log(f"{len(items)} simulated runs, {plan.workers} workers")
    t1 = time.perf_counter()
    _run_all(items, plan.workers, log)
    clock["simulated"] = time.perf_counter() - t1
    if spot_depths(plan):
        t2 = time.perf_counter()
        mpi_sweep(spot_sweep(plan), max(spot_depths(plan)), log)
        clock["mpi"] = time.perf_counter() - t2
    return save_timings(out, clock, t0, log)


def mpi_sweep(sweep: Path, ranks: int, log) -> None:
    """Run a sweep file of MPI spot checks in one ``hpcpipe sweep`` launch of ``ranks`` ranks."""
    cmd = [sys.executable, "-m", "hpcpipe", "sweep", str(sweep), "--np", str(ranks)]
    log("MPI spot checks: " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        log(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise RuntimeError(f"the MPI spot checks failed (exit {proc.returncode})")


def save_timings(out: Path, clock: dict, t0: float, log) -> dict:
    """Add the total since ``t0`` to a study's wall-clock timings, write timings.json, log them."""
    clock["total"] = time.perf_counter() - t0
    (out / "timings.json").write_text(json.dumps(clock, indent=1))
    log("wall seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in clock.items()))
    return clock


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(t) for t in text.split(",") if t.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def main(argv: list[str] | None = None) -> int:
    d = DepthPlan()
    p = argparse.ArgumentParser(prog="python -m hpcpipe.studies.depth_runs", description=__doc__)
    p.add_argument("--out", default=d.out)
    p.add_argument("--problem", default=d.problem)
    p.add_argument("--dim", type=int, default=d.dim, help="0: d = x^2/16 per x (nesterov-chain)")
    p.add_argument("--xs", type=_floats, default=d.xs, help="RL/eps values, comma separated")
    p.add_argument("--depths", type=_ints, default=d.depths)
    p.add_argument("--spot-depths", type=_ints, default=d.spot_depths)
    p.add_argument("--spot-iterations", type=int, default=d.spot_iterations)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--no-tuned", action="store_true")
    p.add_argument("--fault", default="", choices=("",) + FAULTS)
    p.add_argument(
        "--layers",
        default=d.layers,
        choices=("auto", "dense", "householder"),
        help="the chain's orthogonal layers: dense (d x d each), householder (O(d) each) or "
        f"auto (dense up to d = {DENSE_UP_TO}, householder above)",
    )
    p.add_argument(
        "--reduce-above",
        type=int,
        default=d.reduce_above,
        help="Householder points deeper than this run on the reduced route (timed at their "
        "depth, computed on the chain's first block); -1: never",
    )
    a = p.parse_args(argv)
    bad = [x for x in a.depths + a.spot_depths if x < 1] + [x for x in a.xs if not x > 0]
    if bad or a.dim < 0 or a.workers < 1 or a.spot_iterations < 1 or a.reduce_above < -1:
        print(
            f"depth_runs: depths, workers must be >= 1, dim >= 0, reduce-above >= -1 and "
            f"xs > 0 (got {bad or a.reduce_above})"
        )
        return 2
    if a.dim == 0 and a.problem != "nesterov-chain":
        print(
            f"depth_runs: --dim 0 (d = x^2/16 per x) is for nesterov-chain; give --dim for "
            f"{a.problem}"
        )
        return 2
    if a.dim == 0 and min(a.xs) < 4:
        print("depth_runs: nesterov-chain needs every x = RL/eps >= 4 (chain length x^2/16 >= 1)")
        return 2
    plan = DepthPlan(
        out=a.out,
        problem=a.problem,
        dim=a.dim,
        xs=a.xs,
        depths=a.depths,
        spot_depths=a.spot_depths,
        spot_iterations=a.spot_iterations,
        workers=a.workers,
        tuned=not a.no_tuned,
        fault=a.fault,
        layers=a.layers,
        reduce_above=a.reduce_above,
    )
    from hpcpipe.errors import ConfigError

    try:
        check_points(all_points(plan), plan.workers)
    except (ConfigError, ValueError) as e:
        print(f"depth_runs: {e}", file=sys.stderr)
        return 2
    run_study(plan, log=functools.partial(print, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
