"""Study 1: iteration time against K, m and Δ: T_iter = a·(K·m + S − 1) + b.

With S stages (one per rank), K samples of m examples (one example per work
item, n = K·m items), the fill-drain schedules cost (n + S − 1) slots per
direction; sequential costs n·S. On the model clock the law is exact; on the
wall clock with emulated layers it should hold within 10%.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from hpcpipe.studies.common import StudyResult, Verdict, figure, files_of, linfit, save_figure

NAME = "pipeline-time"
TOL = {"model": 1e-9, "wall": 0.10}


def _n_items(r) -> int:
    m = int(r.config["m"])
    micro = int(r.config.get("microbatches", 0)) or m
    return int(r.method.get("samples", 1)) * micro


def applicable(r) -> bool:
    return r.config.get("mode") == "practical"


def study(records, outdir: Path) -> StudyResult:
    res = StudyResult(NAME)
    recs = [r for r in records if applicable(r) and len(r.it["iteration"]) > 0]
    if not recs:
        return res
    groups = defaultdict(list)
    for r in recs:
        per_stage = r.config["depth"] // r.n_ranks
        key = (r.config["schedule"], r.config["clock"], per_stage, r.config["layer_time"])
        groups[key].append(r)
    rows = []
    plt = figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    for (sched, clock, _per_stage, lt), g in sorted(groups.items()):
        n = np.array([_n_items(r) for r in g])
        S = np.array([r.n_ranks for r in g])
        T = np.array([r.iteration_time for r in g])
        x = n * S if sched == "sequential" else n + S - 1
        law = "n*S" if sched == "sequential" else "K*m + S - 1"
        a, b, r2 = linfit(x, T)
        dev = float(np.max(np.abs(T - (a * x + b)) / T))
        tol = TOL[clock]
        ok = dev <= tol and (len(g) >= 3)
        res.verdicts.append(
            Verdict(
                NAME,
                f"{sched} iteration time follows a*({law}) + b ({clock} clock"
                + (f", emulated {lt * 1e3:g} ms/layer" if lt else "")
                + ")",
                f"max relative deviation <= {tol:g} over >= 3 points",
                f"a = {a:.4g}, b = {b:.3g}, R^2 = {r2:.6f}, max dev = {dev:.2e}, {len(g)} points",
                ok,
                files_of(g),
            )
        )
        for r, xi, ti in zip(g, x, T):
            rows.append(
                [
                    r.file,
                    sched,
                    clock,
                    int(r.method.get("samples", 1)),
                    int(r.config["m"]),
                    int(r.n_ranks),
                    int(xi),
                    ti,
                    a * xi + b,
                ]
            )
        order = np.argsort(x)
        ax.plot(x[order], T[order], "o", label=f"{sched} ({clock})")
        ax.plot(x[order], (a * x + b)[order], "-", lw=1)
    ax.set_xlabel("slots: K*m + S - 1 (sequential: n*S)")
    ax.set_ylabel("iteration time")
    ax.legend(fontsize=7)
    ax.set_title("pipeline time law")
    save_figure(fig, outdir, "pipeline_time.png", res)
    res.tables.append(
        (
            "iteration times",
            ["file", "schedule", "clock", "K", "m", "S", "slots", "T_iter", "fit"],
            rows,
        )
    )
    _speedup(res, groups)
    return res


def _speedup(res: StudyResult, groups) -> None:
    """Depth speed-up of pipelining over the sequential schedule: n·S/(n + S − 1)."""
    seq = {}
    for (sched, clock, per_stage, lt), g in groups.items():
        for r in g:
            key = (clock, per_stage, lt, _n_items(r), r.n_ranks)
            if sched == "sequential":
                seq[key] = r
    rows, devs, files = [], [], []
    for (sched, clock, per_stage, lt), g in groups.items():
        if sched != "gpipe":
            continue
        for r in g:
            key = (clock, per_stage, lt, _n_items(r), r.n_ranks)
            if key not in seq:
                continue
            s = seq[key]
            n, S = _n_items(r), r.n_ranks
            got = s.iteration_time / r.iteration_time
            want = n * S / (n + S - 1)
            rows.append([s.file, r.file, clock, n, S, got, want])
            devs.append((abs(got - want) / want, TOL[clock]))
            files += [s.file, r.file]
    if rows:
        ok = all(d <= t for d, t in devs)
        res.verdicts.append(
            Verdict(
                NAME,
                "speed-up of GPipe over sequential = n*S/(n + S - 1)",
                "relative deviation within the clock's tolerance",
                f"max dev {max(d for d, _ in devs):.2e} over {len(rows)} pairs",
                ok,
                sorted(files),
            )
        )
        res.tables.append(
            (
                "depth speed-up",
                ["sequential file", "gpipe file", "clock", "n", "S", "measured", "n*S/(n+S-1)"],
                rows,
            )
        )
