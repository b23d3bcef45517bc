"""Smooth non-convex: time to ‖∇f‖ ≤ ε of pipelined GD against the depth-dependent bounds.

The instance is ``zero-chain`` (``hpcpipe.problems.nonconvex``): Carmon et al.'s
non-convex chain f̄_T (T = d) through Δ orthogonal blocks, β = 152,
f(θ₀) − f* = √(2πe)(1/2 + e(T − 1)). GD runs at η = 1/β; one call costs
(m + Δ − 1)(t_F + t_B) = Δ(t_F + t_B) (m = 1, GPipe), and the run's row t
holds ‖∇f(θ_{t−1})‖, answered by call t. Both bounds are derived in
``hpcpipe.problems.nonconvex``:

* upper (Nesterov 2004, §1.2.3): some θ_t, t < N_ub = ⌈2β(f(θ₀) − f*)/ε²⌉, has
  ‖∇f(θ_t)‖ ≤ ε, so time ≤ N_ub·(m + Δ − 1)(t_F + t_B);
* lower (Carmon et al. 2020, Lemma 3; for ε ≤ 1 and methods in the span of
  their gradients, as GD): no θ_t with t < T has ‖∇f(θ_t)‖ ≤ 1, so the first
  such point is answered by call T + 1 at the earliest, and each call waits
  Δ(t_F + t_B) for its answer: time ≥ (T + 1)·Δ(t_F + t_B).

Consistency (reported apart): the MPI spot checks equal the simulated runs.
The lower side fails for a timing that charges the depth once per run; the
upper side fails for GD whose step is divided by 64 (e.g. by the depth) at small T.

    hpcpipe sweep jobs/sweeps/nonconvex.toml && hpcpipe sweep jobs/sweeps/nonconvex-mpi.toml
    hpcpipe analyze results/nonconvex results/nonconvex-mpi -o report --study nonconvex
"""

from __future__ import annotations

import math
from pathlib import Path

from hpcpipe.problems.nonconvex import gd_calls
from hpcpipe.studies.common import (
    StudyResult,
    Verdict,
    depth_ratio_figure,
    files_of,
    mpi_equals_simulated,
    row_table,
    save_figure,
)

NAME = "nonconvex"


def applicable(r) -> bool:
    return r.problem.get("name") == "zero-chain" and r.config.get("optimizer") == "gd"


def bounds(r) -> dict:
    eps, beta = r.config["epsilon"], r.problem["beta"]
    T, depth = int(r.problem["dim"]), int(r.config["depth"])
    per_call = depth * (r.config["t_forward"] + r.config["t_backward"])
    n_ub = gd_calls(T, eps, beta)
    row, t = r.first_reach(eps, "grad_norm")  # row t: ‖∇f(θ_{t−1})‖
    return {
        "file": r.file,
        "T": T,
        "eps": eps,
        "depth": depth,
        "lr*beta": r.config["lr"] * beta,
        "calls": row,
        "lower": (T + 1) * per_call if eps <= 1 else math.nan,
        "time": t,
        "upper": n_ub * per_call,
        "N_ub": n_ub,
        "budget": int(r.info.get("iterations_planned", len(r.it["iteration"]))),
    }


def _ratio(rows, key) -> str:
    q = [w["time"] / w[key] for w in rows if math.isfinite(w["time"]) and math.isfinite(w[key])]
    return f"[{min(q):.3g}, {max(q):.3g}]" if q else "[-]"


def study(records, outdir: Path) -> StudyResult:
    res = StudyResult(NAME)
    recs = [r for r in records if applicable(r)]
    if not recs:
        return res
    rows = [bounds(r) for r in recs]
    files = files_of(recs)
    res.notes.append(
        f"regime: zero-chain, beta = {recs[0].problem['beta']:g}, m = 1, GPipe, one block per "
        f"stage; T = d {sorted({w['T'] for w in rows})}; eps {sorted({w['eps'] for w in rows})}; "
        f"depths {sorted({w['depth'] for w in rows})}; lr*beta "
        f"{sorted({round(w['lr*beta'], 6) for w in rows})}; seeds "
        f"{sorted({int(r.config['seed']) for r in recs})}; executors "
        f"{sorted({r.executor for r in recs})}"
    )
    res.verdicts.append(
        Verdict(
            NAME,
            "zero-chain: the lower bound applies (eps <= 1, GD at lr <= 1/beta)",
            "Carmon et al. 2020, Lemma 3: ||grad f|| > 1 while |z_T| < 1",
            f"eps in [{min(w['eps'] for w in rows):g}, {max(w['eps'] for w in rows):g}]",
            all(w["eps"] <= 1 for w in rows),
            files,
            kind="design",
        )
    )
    low = [not math.isfinite(w["time"]) or w["time"] >= w["lower"] for w in rows]
    res.verdicts.append(
        Verdict(
            NAME,
            "GD: time to ||grad f|| <= eps >= (T + 1) * depth * (t_F + t_B)",
            "zero chain (span methods) x one round trip per call",
            f"time/bound in {_ratio(rows, 'lower')}; {sum(low)}/{len(rows)} runs at or above",
            all(low),
            files,
        )
    )
    up = [
        math.isfinite(w["time"]) and w["calls"] <= w["N_ub"] and w["time"] <= w["upper"]
        for w in rows
    ]
    res.verdicts.append(
        Verdict(
            NAME,
            "GD: time to ||grad f|| <= eps <= N_ub * (m + depth - 1) * (t_F + t_B)",
            "N_ub = ceil(2 beta (f(theta_0) - f*)/eps^2) (Nesterov 2004, §1.2.3)",
            f"time/bound in {_ratio(rows, 'upper')}; {sum(up)}/{len(rows)} runs reach it "
            "at or below",
            all(up),
            files,
        )
    )
    key = ("dim", "epsilon", "depth", "lr", "seed", "schedule")
    spot = mpi_equals_simulated(NAME, recs, lambda r: tuple(r.config[k] for k in key))
    if spot is not None:
        res.verdicts.append(spot)
    series = []
    for T, eps in sorted({(w["T"], w["eps"]) for w in rows}):
        g = sorted((w for w in rows if (w["T"], w["eps"]) == (T, eps)), key=lambda w: w["depth"])
        depths = [w["depth"] for w in g]
        series.append(
            (
                f"T = {T}, eps = {eps:g}: time / upper",
                depths,
                [w["time"] / w["upper"] for w in g],
                "-",
            )
        )
        series.append(
            (
                f"T = {T}, eps = {eps:g}: lower / upper",
                depths,
                [w["lower"] / w["upper"] for w in g],
                ":",
            )
        )
    fig = depth_ratio_figure(
        series,
        "upper bound N_ub * depth * (tF+tB)",
        "pipeline time to ||grad f|| <= eps, over the upper bound",
        "zero-chain: GD (lr = 1/beta), lower bound <= measured <= upper bound",
    )
    save_figure(fig, outdir, "nonconvex.png", res)
    keys = ["T", "eps", "depth", "lr*beta", "calls", "N_ub", "lower", "time", "upper"]
    res.tables.append(
        row_table(
            "zero-chain: GD time to ||grad f|| <= eps between the bounds (tau)",
            rows,
            keys,
            ["T", "eps", "depth"],
        )
    )
    return res
