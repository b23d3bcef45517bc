"""Hard instances measured: GD's iteration exponent, smoothing bias, the final iterate.

Serial (single-process reference, no MPI), so the figures are exact and
cheap; ``serial_run`` performs the run loop's update (the same state, step
rule, noise keys (seed, iteration) and regulariser) on the reference model.

* ``exponent``: GD at its theory step (η = R/(L√T), T = ⌈x²⌉) on a family
  indexed by x = RL/ε; iterations until f(θ_t) − f* ≤ ε, and the fitted
  exponent of iterations ∝ x^p with its t-interval. On nesterov-chain
  (k = ⌊x²/16⌋, ``hard_chain_length``) p = 2 is forced by the bounds
  (≥ k ≈ x²/16, ≤ x²); on l1-chain (d = 16) it is about 1.
* ``final``: PPRS with AC-SA's update at its plan (``acsa_plan``) over seeds: the mean of
  f(θ_T) − f* at the final iterate with its standard error, beside ε and the
  bound, with planted faults (K = 1, γ × 30, no momentum, step × 4) and the
  predicted smoothing floor f(θ_γ*) − f* on pinball-chain.

The dimension study on pinball-chain is ``dimension_runs`` (its runs) and
``dimension`` (its analysis), which use ``fit_exponent`` and ``mean_se``.

    python -m hpcpipe.studies.hardness exponent --x 16 32 64 128
    python -m hpcpipe.studies.hardness final --problem pinball-chain --eps 0.1 --dim 16
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable

import numpy as np

from hpcpipe.model.reference import Reference
from hpcpipe.optim.methods import PPRS, theory_plan
from hpcpipe.problems.base import Problem
from hpcpipe.problems.chains import l1_chain, max_chain
from hpcpipe.problems.worstcase import (
    hard_chain_length,
    nesterov_chain,
    pinball_chain,
    pinball_smoothing_gap,
)

FACTORIES: dict[str, Callable[[int, int, int], Problem]] = {
    "nesterov-chain": nesterov_chain,
    "pinball-chain": pinball_chain,
    "l1-chain": l1_chain,
    "max-chain": max_chain,
}


def pprs_plan(eps: float, L: float, R: float, d: int) -> tuple[PPRS, int, str]:
    """Theory mode's PPRS (AC-SA's update, ``acsa_plan``): (optimizer, T, guarantee)."""
    plan = theory_plan("pprs", eps, L, R, d)
    return plan.method, plan.iterations, plan.guarantee


def _reg_value(prob: Problem, theta: np.ndarray) -> float:
    return prob.regulariser.value(theta) if prob.regulariser is not None else 0.0


def _with_reg_grad(prob: Problem, theta: np.ndarray, g: np.ndarray) -> np.ndarray:
    return g + prob.regulariser.grad(theta) if prob.regulariser is not None else g


def exact_f(prob: Problem, ref: Reference, theta: np.ndarray) -> float:
    """f(θ): the pipeline's loss plus the problem's regulariser."""
    return ref.loss(theta) + _reg_value(prob, theta)


def gd_iterations(
    prob: Problem, eps: float, limit: int | None = None, step_scale: float = 1.0
) -> tuple[int | None, int]:
    """(first t with f(θ_t) − f* ≤ ε or None, planned T) for GD at its theory step
    (times ``step_scale``), within ``limit`` iterations (default T)."""
    plan = theory_plan("gd", eps, prob.L, prob.R, prob.dim)
    limit = plan.iterations if limit is None else limit
    lr = step_scale * plan.method.lr
    ref = Reference(prob.spec, prob.batch, "input")
    theta = ref.initial_point()
    for t in range(limit + 1):
        loss, g = ref.loss_and_grad(theta)
        if float(loss[0]) + _reg_value(prob, theta) - prob.f_star <= eps:
            return t, plan.iterations
        theta = prob.project(theta - lr * _with_reg_grad(prob, theta, g))
    return None, plan.iterations


def family(name: str, x: float, depth: int = 2, seed: int = 0, dim: int = 16):
    """(problem, ε) with RL/ε = x: nesterov-chain with k = d = ⌊x²/16⌋, else d = ``dim``."""
    if name == "nesterov-chain":
        k = hard_chain_length(1.0 / x)
        prob = nesterov_chain(depth, k, seed)
    else:
        prob = FACTORIES[name](depth, dim, seed)
    return prob, prob.R * prob.L / x


def fit_exponent(xs, ns, level: float = 0.95) -> tuple[float, float, float]:
    """Least-squares slope p of log n = p log x + c, with its t-interval at ``level``."""
    from scipy import stats  # analysis only

    lx, ln = np.log(np.asarray(xs, float)), np.log(np.asarray(ns, float))
    res = stats.linregress(lx, ln)
    if len(lx) < 3:
        return float(res.slope), math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, len(lx) - 2) * res.stderr
    return float(res.slope), float(res.slope - half), float(res.slope + half)


def exponent_rows(name: str, xs, depth: int = 2) -> list[tuple]:
    """Rows (x, d, ε, T planned, iterations to ε) of GD on ``name``'s family."""
    rows = []
    for x in xs:
        prob, eps = family(name, x, depth)
        n, T = gd_iterations(prob, eps)
        rows.append((x, prob.dim, eps, T, n))
    return rows


def serial_run(prob: Problem, opt, T: int, seed: int) -> np.ndarray:
    """The run loop's T updates (init / point / update) on the reference model: θ_T."""
    ref = Reference(prob.spec, prob.batch, "input", seed=seed)
    state = opt.init(ref.initial_point(), prob.project)
    for it in range(1, T + 1):
        y = opt.point(state, prob.project)
        _, g = ref.loss_and_grad(y, opt.gamma, it, opt.samples)
        state = opt.update(state, y, _with_reg_grad(prob, y, g), prob.project)
    return state["theta"]


FAULTS: dict[str, Callable[[PPRS], PPRS]] = {
    "planned": lambda m: m,
    "K = 1": lambda m: dataclasses.replace(m, samples=1),
    "gamma x 30": lambda m: dataclasses.replace(m, gamma=30 * m.gamma),
    "no momentum": lambda m: PPRS(2 * m.lr, m.gamma, m.samples, momentum=0.0),
    "step x 4": lambda m: dataclasses.replace(m, lr=4 * m.lr),
}


def final_gaps(
    name: str, eps: float, dim: int, seeds, fault: str = "planned", depth: int = 2
) -> tuple[np.ndarray, dict]:
    """f(θ_T) − f* of PPRS at its theory plan (with a planted fault), one per seed.

    Each seed is a new instance (Q, b) and new noise. The plan is made once
    from the instance's L, R and d (the same for every seed).
    """
    gaps, plan = [], None
    for s in seeds:
        prob = FACTORIES[name](depth, dim, s)
        if plan is None:
            plan = pprs_plan(eps, prob.L, prob.R, prob.dim)
        method = FAULTS[fault](plan[0])
        theta = serial_run(prob, method, plan[1], s)
        ref = Reference(prob.spec, prob.batch, "input")
        gaps.append(exact_f(prob, ref, theta) - prob.f_star)
    m = plan[0]
    info = {"T": plan[1], "K": m.samples, "gamma": m.gamma, "eta": m.lr, "guarantee": plan[2]}
    return np.array(gaps), info


def mean_se(v: np.ndarray) -> tuple[float, float]:
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))


def _exponent(args) -> None:
    for name in args.problems:
        rows = exponent_rows(name, args.x, args.depth)
        print(f"GD (theory step) on {name}: iterations until f - f* <= eps, x = RL/eps")
        print(f"{'x':>6} {'d':>6} {'eps':>9} {'T plan':>8} {'iters':>7}")
        for x, d, eps, T, n in rows:
            print(f"{x:>6g} {d:>6d} {eps:>9.5f} {T:>8d} {n if n is not None else '-':>7}")
        ok = [(r[0], r[4]) for r in rows if r[4]]
        if len(ok) >= 2:
            p, lo, hi = fit_exponent(*zip(*ok))
            print(f"fitted exponent p = {p:.3f}, 95% interval [{lo:.3f}, {hi:.3f}]\n")


def _final(args) -> None:
    print(
        f"PPRS (theory plan) on {args.problem}, d = {args.dim}, eps = {args.eps}, "
        f"{args.seeds} seeds: f(theta_T) - f* at the final iterate"
    )
    for fault in args.faults:
        gaps, info = final_gaps(args.problem, args.eps, args.dim, range(args.seeds), fault)
        m, se = mean_se(gaps)
        verdict = "<= eps" if m <= args.eps else "> eps (fails)"
        print(f"  {fault:<12} mean {m:.5f} +- {se:.5f} (s.e.), max {gaps.max():.5f}  {verdict}")
    print(
        f"  plan: T = {info['T']}, K = {info['K']}, gamma = {info['gamma']:.4g}, "
        f"eta = {info['eta']:.4g}; {info['guarantee']}"
    )
    if args.problem == "pinball-chain":
        for mult in (1, 30):
            floor = pinball_smoothing_gap(args.dim, mult * info["gamma"])
            print(
                f"  predicted smoothing floor f(theta_gamma*) - f* at gamma x {mult}: {floor:.5f}"
            )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m hpcpipe.studies.hardness")
    sub = ap.add_subparsers(dest="what", required=True)
    e = sub.add_parser("exponent", help="GD iterations to eps against x = RL/eps")
    e.add_argument("--x", type=float, nargs="+", default=[24, 32, 48, 64, 96, 128])
    e.add_argument(
        "--problems", nargs="+", default=["nesterov-chain", "l1-chain"], choices=sorted(FACTORIES)
    )
    e.add_argument("--depth", type=int, default=2)
    f = sub.add_parser("final", help="PPRS final-iterate gap over seeds, with planted faults")
    f.add_argument("--problem", default="pinball-chain", choices=sorted(FACTORIES))
    f.add_argument("--eps", type=float, default=0.1)
    f.add_argument("--dim", type=int, default=16)
    f.add_argument("--seeds", type=int, default=10)
    f.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    args = ap.parse_args(argv)
    if args.what == "exponent" and (min(args.x) < 4 or args.depth < 1):
        ap.error("--x: every x = RL/eps must be >= 4 (and --depth >= 1)")
    if args.what == "final" and not (args.eps > 0 and args.dim >= 1 and args.seeds >= 2):
        ap.error("--eps must be > 0, --dim >= 1 and --seeds >= 2 (a standard error needs two)")
    {"exponent": _exponent, "final": _final}[args.what](args)


if __name__ == "__main__":
    main()
