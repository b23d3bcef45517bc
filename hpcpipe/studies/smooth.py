"""Study 4: the smooth regime, where naive pipelined AGD is optimal.

AGD with η = 1/β reaches f − f* <= ε within T = ⌈√(2βR²/ε)⌉ iterations; one
iteration costs 2Δτ (m = K = 1, GPipe), so the time to ε is at most
2√2·Δ·√(βR²/ε) (+ rounding), and Ω(Δ·√(βR²/ε)) for any method: the ratio
time / (Δ·√(βR²/ε)) must stay below 2√2 and be roughly constant.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hpcpipe.studies.common import (
    StudyResult,
    Verdict,
    figure,
    files_of,
    legend_outside,
    loglog_slope,
    save_figure,
)

NAME = "smooth"


def applicable(r) -> bool:
    return (
        r.problem.get("name") == "quad-chain"
        and r.config.get("optimizer") == "agd"
        and r.config.get("mode") == "theory"
    )


def study(records, outdir: Path) -> StudyResult:
    res = StudyResult(NAME)
    recs = [r for r in records if applicable(r)]
    if len(recs) < 3:
        return res
    rows, xs, ts = [], [], []
    for r in recs:
        eps, beta, R = r.config["epsilon"], r.problem["beta"], r.problem["R"]
        depth = r.config["depth"]
        x = depth * math.sqrt(beta * R * R / eps)
        k, t = r.first_reach(eps)
        bound = 2 * depth * math.ceil(math.sqrt(2 * beta * R * R / eps))
        rows.append([r.file, depth, eps, x, k, t, t / x if math.isfinite(t) else math.nan, bound])
        xs.append(x)
        ts.append(t)
    xs, ts = np.array(xs), np.array(ts)
    ok = np.isfinite(ts)
    res.verdicts.append(
        Verdict(
            NAME,
            "pipelined AGD reaches eps on quad-chain",
            "every run reaches f - f* <= eps",
            f"{int(ok.sum())}/{len(ts)}",
            bool(ok.all()),
            files_of(recs),
        )
    )
    within = all(row[5] <= row[7] for row in rows if math.isfinite(row[5]))
    ratio = ts[ok] / xs[ok]
    res.verdicts.append(
        Verdict(
            NAME,
            "AGD time to eps <= 2*depth*ceil(sqrt(2 beta R^2/eps))",
            "upper bound of Nesterov's rate, per run",
            f"time/(depth*sqrt(beta R^2/eps)) in [{ratio.min():.3g}, {ratio.max():.3g}]",
            bool(within and ok.all()),
            files_of(recs),
        )
    )
    if ok.sum() >= 3:
        p, lo, hi = loglog_slope(xs[ok], ts[ok])
        res.verdicts.append(
            Verdict(
                NAME,
                "AGD time scales as depth*sqrt(beta R^2/eps) (optimal, Theta)",
                "log-log slope in [0.8, 1.2]",
                f"slope {p:.3f} [{lo:.3f}, {hi:.3f}]",
                bool(0.8 <= p <= 1.2),
                files_of(recs),
            )
        )
    plt = figure()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    ax.loglog(xs[ok], ts[ok], "o", color="#1f77b4", label="AGD, measured")
    xx = np.sort(xs[ok])
    if ok.sum() >= 3:
        p_fit, c_fit = np.polyfit(np.log(xs[ok]), np.log(ts[ok]), 1)
        ax.loglog(
            xx,
            np.exp(c_fit) * xx**p_fit,
            "-",
            color="#1f77b4",
            label=f"fit: slope {p_fit:.3f} (accepted: 0.8 to 1.2)",
        )
    ax.loglog(xx, 2 * math.sqrt(2) * xx, "--", color="#d62728", label="upper bound 2*sqrt(2)*x")
    ax.set_xlabel("x = depth * sqrt(beta R^2 / eps)")
    ax.set_ylabel("pipeline time to eps (tau)")
    ax.set_title("Smooth regime: AGD time to eps against depth * sqrt(beta R^2/eps)")
    legend_outside(ax)
    save_figure(fig, outdir, "smooth.png", res)
    res.tables.append(
        (
            "AGD on quad-chain",
            [
                "file",
                "depth",
                "eps",
                "depth*sqrt(bR^2/eps)",
                "iterations",
                "time",
                "ratio",
                "bound",
            ],
            rows,
        )
    )
    return res
