"""What a run promised and what it reached: the theory plan's guarantee and epsilon.

In theory mode the run's step size and length come from a bound
(``optim.methods.theory_plan``), which states the accuracy it guarantees
after the planned iterations. Whenever a target ε > 0 and f* are known, the
run also records whether some evaluated iterate reached f(θ_t) − f* <= ε,
at which iteration and pipeline time first, and the best gap. Stored in the
result's ``info`` attribute and printed at the end of the run.
"""

from __future__ import annotations

import math

import numpy as np

from hpcpipe.optim.methods import theory_plan


def outcome(cfg, prob, iteration, gap, pipeline_time) -> dict:
    """The plan's guarantee (theory mode) and whether ε was reached, from the run's columns."""
    out: dict = {}
    if cfg.mode == "theory":
        plan = theory_plan(cfg.optimizer, cfg.epsilon, prob.L, prob.R, prob.dim, prob.beta)
        out["guarantee"] = plan.guarantee
    if cfg.epsilon > 0 and prob.f_star is not None:
        gap = np.asarray(gap, float)
        hit = np.flatnonzero(np.isfinite(gap) & (gap <= cfg.epsilon))
        out["epsilon"] = cfg.epsilon
        out["epsilon_reached"] = bool(hit.size)
        finite = gap[np.isfinite(gap)]
        out["best_gap"] = float(finite.min()) if finite.size else math.nan
        if hit.size:
            out["epsilon_reached_at_iteration"] = int(np.asarray(iteration)[hit[0]])
            out["epsilon_reached_at_time"] = float(np.asarray(pipeline_time)[hit[0]])
    return out


def describe(info: dict) -> list[str]:
    """The lines a run prints about its plan and its target."""
    lines = []
    if "guarantee" in info:
        planned = info.get("iterations_planned")
        after = f" after {planned} iterations" if planned else ""
        lines.append(f"guarantee planned (theory mode): {info['guarantee']}{after}")
    if "epsilon_reached" in info:
        eps = info["epsilon"]
        if info["epsilon_reached"]:
            lines.append(
                f"epsilon {eps:g} reached: f - f* <= {eps:g} first at iteration "
                f"{info['epsilon_reached_at_iteration']} (pipeline time "
                f"{info['epsilon_reached_at_time']:.6g}); best f - f* {info['best_gap']:.4g}"
            )
        else:
            lines.append(f"epsilon {eps:g} NOT reached: best f - f* {info['best_gap']:.4g}")
    return lines
