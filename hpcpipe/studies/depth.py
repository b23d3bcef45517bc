"""Study 2: time to reach ε against depth Δ for GD, AGD and PPRS, to Δ in the thousands.

The runs (``depth_runs``) are tagged ``depth/<setting>``: ``theory`` and
``tuned`` on the simulated pipeline, ``spot`` on real MPI ranks (Δ ≤ 8, model
clock), ``mpi`` from the Slurm folders (Δ = 16–64). m = 1, t_F = t_B = 1τ,
GPipe, one layer per stage, so an iteration of n = K items costs
2(K + Δ − 1)τ and one of GD or AGD 2Δτ.

Predictions (x = RL/ε; T and K from ``theory_plan``):

* bounds' constants: GD/PPRS time ratio ρ_b(Δ) = T_GD·Δ / (T_PPRS·(K + Δ − 1));
  with the plan of DESIGN.md §1 (T_GD = x², T_PPRS = 8x d^(1/4),
  K = 64x²/T_PPRS) this is Δx / (64x + 8 d^(1/4)(Δ − 1)). It exceeds 1 from
  Δ*_b = T_PPRS(K − 1)/(T_GD − T_PPRS) on (when T_GD > T_PPRS) and saturates
  at T_GD/T_PPRS as Δ → ∞;
* measured iteration counts I (iterations to ε, median over depths):
  ρ_I(Δ) = I_GD·Δ / (I_PPRS·(K + Δ − 1)), Δ*_I = I_PPRS(K − 1)/(I_GD − I_PPRS),
  saturation I_GD/I_PPRS; the counts differ a little between depths (each
  depth is another instance), and where I_GD − I_PPRS is a few iterations
  that moves Δ*_I a lot, so the agreement row compares the measured Δ* with
  the range of Δ*_I over the counts' extremes (min and max over depths);
* measured: ρ(Δ) = (GD time to ε)/(PPRS time to ε); Δ* where it crosses 1
  (log-log interpolation between grid depths).

Rows that can fail: GD and PPRS reach ε within their planned T at every
depth (the guarantees: GD's at its best iterate); PPRS's final iterate,
averaged over the depths (each depth is another instance: its own Q), is
within ε (the final-iterate theorem of ``optim.acsa``); PPRS's oracle smooths
no more than the plan's bias budget (below); PPRS faster than GD at the
largest depth (the claim); the measured Δ* agrees (within a factor 2) with
the range of Δ*_I and each PPRS iteration costs 2(K·m + Δ − 1)τ with the plan's K: the
pipeline pays the depth once per iteration, not once per sample.

Smoothing budget. The loss a PPRS iteration records is the mean of
f(y_t + γZ_k) over its K samples (the regulariser exact), an unbiased
estimate of f_γ(y_t); the exact f is taken at θ_t. Since
0 ≤ f_γ − f ≤ γL√d (``optim.acsa``, (i)–(ii)) and ‖y_t − θ_t‖ ≤ 2η‖G_t‖
(AC-SA: θ_t − y_t = a_t·tη·G_t, a_t·t ≤ 2; plain momentum: η‖G_t‖),

    E[loss_t] − f(θ_t) ≤ γL√d + 2ηL‖G_t‖,

with γ, η of the plan (γL√d ≤ ε/4 is the share of ε the plan gives the
smoothing). Measured: the mean over the second half of each run, pooled over
depths, against the mean of the right-hand side plus three standard errors.

Consistency checks (hold by construction; reported apart): per-iteration
time = the closed form; the MPI spot checks equal the simulated runs
(pipeline time bitwise, loss to 1e-9); the PPRS runs at theory settings are
inside the theorem they are judged by (AC-SA's update, the step it records
η ≤ γ/(4L), and its bound at the run's own T, γ, K, η at most ε).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from hpcpipe.optim.acsa import acsa_plan, acsa_terms
from hpcpipe.optim.methods import theory_plan
from hpcpipe.pipeline.reduced import REDUCED_DEPTH
from hpcpipe.pipeline.simulator import closed_form
from hpcpipe.studies.common import (
    StudyResult,
    Verdict,
    figure,
    files_of,
    legend_outside,
    save_figure,
    spot_agreement,
)

NAME = "depth"
SETTINGS = ("theory", "tuned")
SIMULATED = ("simulated", "reduced")  # executors timed by the simulator


def setting(r) -> str | None:
    """The run's role in the study (``depth/<setting>`` tag; a plain ``depth`` tag on a
    theory-mode run, as the small MPI sweep writes, is ``theory``), or None."""
    head, _, tail = str(r.config.get("tag", "")).partition("/")
    if head != NAME:
        return None
    if not tail:
        return "theory" if r.config.get("mode") == "theory" else None
    return tail


def applicable(r) -> bool:
    return setting(r) is not None and r.problem.get("L") is not None


def x_of(r) -> float:
    """x = RL/ε of a run, rounded to 6 digits (a grid value)."""
    return float(f"{r.problem['R'] * r.problem['L'] / r.config['epsilon']:.6g}")


def crossover(depths, ratios) -> float:
    """First Δ where the ratio exceeds 1 (log-log interpolated); inf when it never does."""
    for i, (D, q) in enumerate(zip(depths, ratios)):
        if math.isfinite(q) and q > 1:
            if i == 0 or not (ratios[i - 1] > 0):
                return float(D)
            D0, q0 = depths[i - 1], ratios[i - 1]
            f = -math.log(q0) / (math.log(q) - math.log(q0))
            return math.exp(math.log(D0) + f * (math.log(D) - math.log(D0)))
    return math.inf


def crossover_of_times(depths, t_gd, t_pprs) -> float:
    """First Δ where GD's time to ε exceeds PPRS's; inf when it never does on the grid.

    Between two grid depths each time is interpolated linearly in Δ, and the crossing of
    the two lines is returned. On the model clock a method's time to ε is
    I·(a + bΔ) (GPipe: I·2(K + Δ − 1)τ), affine in Δ, so when the iteration counts I are
    the same at both ends the interpolation is exact and Δ* equals ``law_crossover`` of
    the counts. Interpolating the ratio instead (which saturates in Δ) is not exact and,
    on a coarse grid (64 → 4096), misplaces Δ* by a factor of several."""
    for i, (D, a, b) in enumerate(zip(depths, t_gd, t_pprs)):
        if math.isfinite(a) and math.isfinite(b) and a > b:
            if i == 0:
                return float(D)
            D0, a0, b0 = depths[i - 1], t_gd[i - 1], t_pprs[i - 1]
            g0, g1 = a0 - b0, a - b
            if not (math.isfinite(g0) and g0 <= 0):
                return float(D)
            return float(D0 + (D - D0) * (-g0) / (g1 - g0))
    return math.inf


def law_crossover(i_gd: float, i_pprs: float, K: int) -> float:
    """Δ with I_GD·Δ = I_PPRS·(K + Δ − 1): Δ* = I_PPRS(K − 1)/(I_GD − I_PPRS) (inf if none)."""
    if not (math.isfinite(i_gd) and math.isfinite(i_pprs)) or i_gd <= i_pprs:
        return math.inf
    return max(1.0, i_pprs * (K - 1) / (i_gd - i_pprs))


def crossover_agrees(measured: float, lo: float, hi: float, first: float, last: float) -> bool:
    """The measured Δ* against the range [lo, hi] the iteration counts allow, within a
    factor 2: lo/2 ≤ Δ* ≤ 2·hi; a crossover at the grid's first depth agrees when
    lo < first, and none on the grid when hi > last (inf: never)."""
    if not math.isfinite(measured):
        return hi > last
    if measured == first and lo < first:
        return True
    return lo / 2 <= measured <= 2 * hi


def law_ratio(i_gd: float, i_pprs: float, K: int, depth) -> np.ndarray:
    d = np.asarray(depth, float)
    return i_gd * d / (i_pprs * (K + d - 1))


def _range(v) -> tuple[float, float]:
    """(min, max) of the finite values; (inf, inf) when none (never reached)."""
    a = np.asarray([u for u in v if math.isfinite(u)], float)
    return (float(a.min()), float(a.max())) if a.size else (math.inf, math.inf)


def _fmt_count(lo: float, hi: float) -> str:
    if not math.isfinite(lo):
        return "none reached"
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def _fmt_depth(v: float) -> str:
    return "never" if not math.isfinite(v) else f"{v:.3g}"


def _consistency(recs, res: StudyResult) -> None:
    """Per-iteration time = closed form; MPI spot checks = the simulated runs."""
    bad, n = [], 0
    for r in recs:
        if r.executor not in SIMULATED or len(r.it["iteration"]) == 0:
            continue
        S = _stages(r)
        K = int(r.method.get("samples", 1)) * int(r.config.get("microbatches") or 1)
        want = closed_form(
            r.config["schedule"], S, K, r.config["t_forward"] * 1.0, r.config["t_backward"] * 1.0
        )
        want *= r.config["depth"] / S
        n += 1
        if not np.allclose(r.per_iteration_time, want, rtol=1e-12, atol=0):
            bad.append(r.file)
    if n:
        res.verdicts.append(
            Verdict(
                NAME,
                "simulated per-iteration time = closed form 2(n + S - 1)tau",
                "schedule closed form (simulator.closed_form)",
                f"{n - len(bad)}/{n} runs equal to 1e-12",
                not bad,
                sorted(bad) or files_of([r for r in recs if r.executor in SIMULATED]),
                kind="consistency",
                executor="simulated",
            )
        )
    sims = {
        (r.config["optimizer"], x_of(r), int(r.config["depth"])): r
        for r in recs
        if setting(r) == "theory"
    }
    spots = [r for r in recs if setting(r) == "spot"]
    if not spots:
        return
    agree, pairs, bad, k = spot_agreement(
        spots, lambda s: sims.get((s.config["optimizer"], x_of(s), int(s.config["depth"])))
    )
    res.verdicts.append(
        Verdict(
            NAME,
            "MPI spot checks (depth <= 8, model clock) = simulated runs",
            "pipeline time bitwise, loss to 1e-9, same configuration",
            f"{agree}/{pairs} runs agree (first {k} iterations each)",
            pairs > 0 and agree == pairs,
            sorted(bad) or files_of(spots),
            kind="consistency",
            executor="mpi + simulated",
        )
    )


def study(records, outdir: Path) -> StudyResult:
    res = StudyResult(NAME)
    recs = [r for r in records if applicable(r)]
    if not recs:
        return res
    _consistency(recs, res)
    groups = defaultdict(list)
    for r in recs:
        if setting(r) in SETTINGS:
            groups[(setting(r), r.config["optimizer"], x_of(r))].append(r)
    prob = recs[0].problem["name"]
    dims = {x_of(r): int(r.problem["dim"]) for r in recs}
    res.notes.append(
        f"regime: {prob}, m = 1, GPipe, t_F = t_B = 1 tau, one layer per stage; "
        f"x = RL/eps in {sorted(dims)} with d = "
        + ", ".join(f"{dims[x]} (x = {x:g})" for x in sorted(dims))
        + "; depths "
        f"{sorted({int(r.config['depth']) for r in recs})}; seed "
        f"{sorted({int(r.config['seed']) for r in recs})}; layers "
        f"{sorted({str(r.config.get('layers', 'dense')) for r in recs})}; rows marked "
        "simulated ran on the simulated pipeline, rows marked mpi on real MPI ranks"
    )
    deep = sorted(
        {int(r.config["depth"]) for r in recs if r.executor == "reduced"} - {REDUCED_DEPTH}
    )
    if deep:
        res.notes.append(
            "reduced route (pipeline.reduced) at depths "
            f"{deep}: timed on the depth's stages, computed on the chain's first "
            f"{REDUCED_DEPTH} blocks (bitwise the run at depth {REDUCED_DEPTH}). "
            "GD and AGD record the full run's values to rounding; PPRS's record is equal in "
            "distribution only (its smoothing noise is not rotated): one realisation serves "
            "every reduced depth of an (x, setting), where full runs draw one per depth"
        )
    rows, times, iters, Ks = [], {}, {}, {}
    for (st, opt, x), g in sorted(groups.items()):
        g = sorted(g, key=lambda r: r.config["depth"])
        eps = g[0].config["epsilon"]
        for r in g:
            k, t = r.first_reach(eps)
            T = int(r.info.get("iterations_planned", len(r.it["iteration"])))
            gap = r.it["gap"][np.isfinite(r.it["gap"])]
            final = float(gap[-1]) if gap.size else math.nan
            D = int(r.config["depth"])
            rows.append([st, opt, x, D, r.executor, k, T, t, final, r.file])
            times[(st, opt, x, D)] = t
            iters.setdefault((st, opt, x), []).append(k)
            Ks[(st, opt, x)] = int(r.method.get("samples", 1))
        # the instance must be non-trivial: θ₀ itself must not reach ε
        gap0 = min(r.info.get("initial_gap", math.inf) for r in g)
        trivial = gap0 <= eps
        if st == "theory" and (opt in ("gd", "pprs") or trivial):
            mine = rows[-len(g) :]
            within = [math.isfinite(rw[5]) and rw[5] <= rw[6] for rw in mine]
            res.verdicts.append(
                Verdict(
                    NAME,
                    f"{opt} reaches eps = {eps:.4g} within its planned T (theory settings, "
                    f"x = {x:g})",
                    "GD: min f - f* <= RL/sqrt(T); PPRS: the bound of theory_plan; "
                    "from f(theta0) - f* > eps",
                    f"{sum(within)}/{len(g)} depths; iterations to eps "
                    f"{_span(iters[(st, opt, x)])} of T = {mine[-1][6]}; final gaps "
                    f"{_span([rw[8] for rw in mine])}; f(theta0) - f* = {gap0:.3g}"
                    + (" <= eps: the instance is trivial" if trivial else ""),
                    all(within) and not trivial,
                    files_of(g),
                    executor=_executors(g),
                )
            )
        if st == "theory" and opt == "pprs":
            _final_iterate(res, g, eps, x)
            _smoothing_budget(res, g, eps, x)
            _in_theorem(res, g, eps, x)
    _tuning(res, recs)
    _pipelined(res, recs)
    res.tables.append(
        (
            "time to eps per run",
            [
                "setting",
                "optimizer",
                "x",
                "depth",
                "executor",
                "iterations to eps",
                "planned T",
                "pipeline time to eps",
                "final f - f*",
                "file",
            ],
            rows,
        )
    )
    _crossovers(res, recs, times, iters, Ks, outdir)
    return res


def _tuning(res: StudyResult, recs) -> None:
    """Design: each method's tuned step lies strictly inside the factor grid it was tuned on.

    ``depth_runs.tune`` keeps, per (method, x), the factor whose run at the tuning depth
    reached ε in the least pipeline time; a best factor at an edge of the grid says the
    method's best step may lie beyond it, so its ``tuned`` rows would not be at its best.
    A (method, x) with no step of the grid reaching ε has no best step; it is listed, and
    its tuned rows read "never".
    """
    tune = defaultdict(list)
    for r in recs:
        if setting(r) == "tune":
            tune[(r.config["optimizer"], x_of(r))].append(r)
    if not tune:
        return
    edge, inside, never = [], 0, []
    for (opt, x), g in sorted(tune.items()):
        eps = g[0].config["epsilon"]
        lrs = sorted({float(r.config["lr"]) for r in g})
        t_lr = [(r.first_reach(eps)[1], float(r.config["lr"])) for r in g]
        reached = [(t, lr) for t, lr in t_lr if math.isfinite(t)]
        if not reached:  # no best step to place: its tuned rows read "never"
            never.append(f"{opt} x = {x:g}")
            continue
        best = min(reached)[1]
        if len(lrs) >= 3 and lrs[0] < best < lrs[-1]:
            inside += 1
        else:
            pos = "largest" if best == lrs[-1] else "smallest"
            edge.append(f"{opt} x = {x:g}: best at the {pos} of {len(lrs)} steps")
    res.verdicts.append(
        Verdict(
            NAME,
            "each method's tuned step lies inside its tuning grid (tuned rows at each "
            "method's best step)",
            "best factor strictly between the grid's smallest and largest, for every "
            "(method, x) that reaches eps at some step of the grid",
            f"{inside}/{len(tune) - len(never)} (method, x) inside"
            + (f"; {'; '.join(edge)}" if edge else "")
            + (f"; no step of the grid reaches eps: {', '.join(never)}" if never else ""),
            not edge,
            files_of([r for g in tune.values() for r in g]),
            kind="design",
            executor=_executors([r for g in tune.values() for r in g]),
        )
    )


def _plan(r, eps: float):
    """theory_plan's PPRS for the run's problem and ε."""
    p = r.problem
    return theory_plan("pprs", eps, p["L"], p["R"], int(p["dim"]), p.get("beta"))


def _mean_se(v) -> tuple[float, float]:
    a = np.asarray(v, float)
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan
    return float(a.mean()), se


def _final_iterate(res: StudyResult, g, eps: float, x: float) -> None:
    """E f(θ_T) − f* ≤ bound ≤ ε at the final iterate (``optim.acsa``), estimated by the
    mean over depths of the runs that completed their T iterations."""
    p = g[0].problem
    bound = acsa_plan(eps, p["L"], p["R"], int(p["dim"])).bound
    finals, short = [], []
    for r in g:
        gap, T = r.it["gap"], int(r.info.get("iterations_planned", 0))
        done = len(gap) > 0 and int(r.it["iteration"][-1]) == T and math.isfinite(gap[-1])
        (finals if done else short).append(float(gap[-1]) if done else r.file)
    m, se = _mean_se(finals) if finals else (math.nan, math.nan)
    res.verdicts.append(
        Verdict(
            NAME,
            f"PPRS's final iterate within eps = {eps:.4g} (theory settings, x = {x:g})",
            f"E f(theta_T) - f* <= {bound:.3g} <= eps "
            "(AC-SA final-iterate theorem, optim.acsa; mean over depths: other instances)",
            f"mean {m:.3g} +- {se:.2g} (s.e.) over {len(finals)} depths, max "
            + (f"{max(finals):.3g}" if finals else "-")
            + (f"; {len(short)} runs stopped before T" if short else ""),
            bool(finals) and not short and m <= eps,
            files_of(g),
            executor=_executors(g),
        )
    )


def _smoothing_budget(res: StudyResult, g, eps: float, x: float) -> None:
    """E[loss_t] − f(θ_t) ≤ γL√d + 2ηL‖G_t‖ with the plan's γ and η (module docstring)."""
    plan = _plan(g[0], eps)
    L, d = g[0].problem["L"], int(g[0].problem["dim"])
    gamma, eta = plan.method.gamma, plan.method.lr
    excess, rhs = [], []
    for r in g:
        it = r.it
        keep = np.isfinite(it["f"]) & (it["iteration"] > len(it["iteration"]) // 2)
        excess.append(it["loss"][keep] - it["f"][keep])
        rhs.append(gamma * L * math.sqrt(d) + 2 * eta * L * it["grad_norm"][keep])
    e, b = np.concatenate(excess), np.concatenate(rhs)
    if e.size < 2:
        return
    m, se = _mean_se(e)
    res.verdicts.append(
        Verdict(
            NAME,
            f"PPRS's oracle smooths within the plan's bias budget (theory settings, x = {x:g})",
            f"mean loss_t - f(theta_t) <= gamma L sqrt(d) + 2 eta L |G_t| = {b.mean():.3g} "
            f"(+ 3 s.e.), gamma = {gamma:.3g}, eta = {eta:.3g} of the plan; "
            f"gamma L sqrt(d) = {gamma * L * math.sqrt(d):.3g} <= eps/4",
            f"{m:.3g} +- {se:.2g} (s.e.) over {e.size} iterations (second halves)",
            bool(m <= b.mean() + 3 * se),
            files_of(g),
            executor=_executors(g),
        )
    )


def _in_theorem(res: StudyResult, g, eps: float, x: float) -> None:
    """Consistency: what ran is the theorem's method with a bound ≤ ε at its own settings."""
    L, R, d = g[0].problem["L"], g[0].problem["R"], int(g[0].problem["dim"])
    bad, worst = [], 0.0
    for r in g:
        m = r.method
        gamma, K, T = float(m["gamma"]), int(m["samples"]), int(r.info["iterations_planned"])
        steps = np.unique(r.it["step"])
        eta = float(steps.max()) if steps.size else math.nan
        why = []
        if m.get("momentum") != "acsa":
            why.append(f"momentum {m.get('momentum')!r}, not AC-SA's")
        if not eta <= gamma / (4 * L) * (1 + 1e-12):
            why.append(f"step {eta:.3g} > gamma/(4L) = {gamma / (4 * L):.3g}")
        else:
            b = sum(acsa_terms(L, R, d, gamma, K, T, eta))
            worst = max(worst, b)
            if b > eps:
                why.append(f"bound {b:.3g} > eps")
        if why:
            bad.append(f"{r.file}: " + "; ".join(why))
    res.verdicts.append(
        Verdict(
            NAME,
            f"PPRS at theory settings runs inside its theorem (x = {x:g})",
            "AC-SA's update, recorded step eta <= gamma/(4L), bound at the run's own "
            f"(T, gamma, K, eta) <= eps = {eps:.4g}",
            f"{len(g) - len(bad)}/{len(g)} runs"
            + (f"; worst bound {worst:.3g}" if worst else "")
            + (f"; {bad[0]}" if bad else ""),
            not bad,
            files_of(g),
            kind="consistency",
            executor=_executors(g),
        )
    )


def _pipelined(res: StudyResult, recs) -> None:
    """PPRS's iteration costs 2(K·m + Δ − 1) slots of τ: the depth once per iteration.

    The bound's time T·(K·m + Δ − 1) rests on it; a pipeline that pays the depth
    once per sample (2K·m·Δ) fails it, whatever schedule it records.
    """
    pp = [r for r in recs if r.config["optimizer"] == "pprs" and setting(r) in SETTINGS]
    if not pp:
        return
    worst, bad = 0.0, []
    for r in pp:
        K, m, D = _planned_samples(r), int(r.config["m"]), int(r.config["depth"])
        S = _stages(r)
        slot = (float(r.config["t_forward"]) + float(r.config["t_backward"])) * D / S
        want = slot * (K * m + S - 1)
        dev = float(np.max(np.abs(r.per_iteration_time - want))) / want
        worst = max(worst, dev)
        if dev > 1e-9:
            bad.append(r.file)
    res.verdicts.append(
        Verdict(
            NAME,
            "PPRS pays the depth once per iteration: iteration time = (t_F + t_B)(K*m + Delta - 1)",
            "the pipelined oracle of the PPRS time bound, K from the run's plan "
            "(relative deviation <= 1e-9)",
            f"{len(pp) - len(bad)}/{len(pp)} runs; worst relative deviation {worst:.3g}",
            not bad,
            sorted(bad) or files_of(pp),
            executor=_executors(pp),
        )
    )


def _planned_samples(r) -> int:
    """K of the run's plan: theory_plan's for theory runs, the run's own setting otherwise."""
    if setting(r) != "theory":
        return int(r.method.get("samples", 1))
    p = r.problem
    eps = float(r.config["epsilon"])
    return int(
        theory_plan("pprs", eps, p["L"], p["R"], int(p["dim"]), p.get("beta")).method.samples
    )


def _stages(r) -> int:
    """Pipeline stages S of a run: its ranks (mpi) or its ``stages`` setting (simulated)."""
    if r.executor == "mpi":
        return int(r.n_ranks)
    return int(r.config.get("stages") or r.config["depth"])


def _span(v) -> str:
    a = np.asarray([u for u in v if math.isfinite(u)], float)
    if a.size == 0:
        return "none reached"
    return f"{a.min():.4g}" if a.min() == a.max() else f"{a.min():.4g}-{a.max():.4g}"


def _executors(g) -> str:
    return " + ".join(sorted({r.executor for r in g}))


def _predicted_crossover(x, big, predicted, measured, files, pair) -> Verdict:
    """Enforced: where the theory runs' iteration counts put the crossover inside the grid
    (GD/PPRS ratio > 1 at the largest depth from the counts), the measured ratio there
    exceeds 1 too. Where they put none inside it, the row is reported, not judged."""
    inside = math.isfinite(predicted) and predicted > 1
    return Verdict(
        NAME,
        f"PPRS overtakes GD by depth {big} where its iteration counts predict it "
        f"(theory, x = {x:g})",
        "if the counts predict a GD/PPRS time ratio > 1 at the largest depth, the measured "
        "ratio there is > 1",
        f"predicted from the counts {predicted:.3g}, measured {measured:.3g}"
        + ("" if inside else ": no crossover predicted inside the grid, not judged"),
        bool(measured > 1) if inside else None,
        files,
        executor=_executors(pair),
    )


def _crossovers(res, recs, times, iters, Ks, outdir) -> None:
    """Crossover table (measured, bounds, iteration counts), saturation, the claim rows."""
    table = []
    plt = figure()
    fig, ax = plt.subplots(figsize=(8.4, 4.6))
    consts = {x_of(r): (r.problem["L"], r.problem["R"], int(r.problem["dim"])) for r in recs}
    for st in SETTINGS:
        for x in sorted({k[2] for k in times if k[0] == st}):
            depths = sorted(
                D
                for (s, o, xx, D) in times
                if (s, o, xx) == (st, "gd", x) and (st, "pprs", x, D) in times
            )
            if not depths:
                continue
            ratio = [times[(st, "gd", x, D)] / times[(st, "pprs", x, D)] for D in depths]
            L, R, d = consts[x]
            eps = R * L / x
            gd_plan = theory_plan("gd", eps, L, R, d)
            pp_plan = theory_plan("pprs", eps, L, R, d)
            Tg, Tp, Kp = gd_plan.iterations, pp_plan.iterations, pp_plan.method.samples
            K = Ks.get((st, "pprs", x), Kp)
            i_gd = float(np.nanmedian(iters[(st, "gd", x)]))
            i_pp = float(np.nanmedian(iters[(st, "pprs", x)]))
            d_meas = crossover_of_times(
                depths,
                [times[(st, "gd", x, D)] for D in depths],
                [times[(st, "pprs", x, D)] for D in depths],
            )
            d_bound = law_crossover(Tg, Tp, Kp)
            d_iter = law_crossover(i_gd, i_pp, K)
            # the counts vary over depths (each depth is another instance): the Δ* they allow
            g_lo, g_hi = _range(iters[(st, "gd", x)])
            p_lo, p_hi = _range(iters[(st, "pprs", x)])
            d_lo, d_hi = law_crossover(g_hi, p_lo, K), law_crossover(g_lo, p_hi, K)
            big = depths[-1]
            rb = float(law_ratio(Tg, Tp, Kp, big))
            ri = float(law_ratio(i_gd, i_pp, K, big)) if math.isfinite(i_gd + i_pp) else math.nan
            table.append(
                [
                    st,
                    x,
                    d,
                    _fmt_depth(d_meas),
                    _fmt_depth(d_bound),
                    _fmt_depth(d_iter),
                    f"{_fmt_depth(d_lo)} to {_fmt_depth(d_hi)}",
                    ratio[-1],
                    rb,
                    ri,
                    Tg / Tp,
                    i_gd / i_pp if i_pp else math.nan,
                ]
            )
            pair = [
                r
                for r in recs
                if setting(r) == st and x_of(r) == x and r.config["optimizer"] in ("gd", "pprs")
            ]
            files = files_of(pair)
            res.verdicts.append(
                Verdict(
                    NAME,
                    f"PPRS faster than GD at the largest depth {big} ({st}, x = {x:g})",
                    f"predicted GD/PPRS time ratio: {rb:.3g} from the bounds' constants, "
                    f"{ri:.3g} from the measured iteration counts",
                    f"measured ratio {ratio[-1]:.3g}",
                    bool(ratio[-1] > 1),
                    files,
                    kind="claim",
                    executor=_executors(pair),
                )
            )
            if st == "theory":
                res.verdicts.append(_predicted_crossover(x, big, ri, ratio[-1], files, pair))
            agree = crossover_agrees(d_meas, d_lo, d_hi, depths[0], big)
            res.verdicts.append(
                Verdict(
                    NAME,
                    f"PPRS pays the depth once per iteration: crossover where its iteration "
                    f"counts put it ({st}, x = {x:g})",
                    f"Delta* = I_PPRS(K-1)/(I_GD - I_PPRS) = {_fmt_depth(d_iter)} at the "
                    f"median counts, {_fmt_depth(d_lo)} to {_fmt_depth(d_hi)} over the counts "
                    f"of the depths (I_GD {_fmt_count(g_lo, g_hi)}, I_PPRS "
                    f"{_fmt_count(p_lo, p_hi)}, K = {K}; within a factor 2)",
                    f"measured Delta* = {_fmt_depth(d_meas)} (bounds' constants: "
                    f"{_fmt_depth(d_bound)})",
                    bool(agree),
                    files,
                    executor=_executors(pair),
                )
            )
            (line,) = ax.plot(depths, ratio, "o-", label=f"{st} x={x:g} measured")
            grid = np.geomspace(depths[0], depths[-1], 60)
            ax.plot(
                grid,
                law_ratio(Tg, Tp, Kp, grid),
                "--",
                color=line.get_color(),
                lw=1,
                label=f"bounds' constants x={x:g}",
            )
            if math.isfinite(i_gd + i_pp):
                ax.plot(
                    grid,
                    law_ratio(i_gd, i_pp, K, grid),
                    ":",
                    color=line.get_color(),
                    lw=1,
                    label=f"from iteration counts x={x:g}",
                )
    if not table:
        plt.close(fig)
        return
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("depth")
    ax.set_ylabel("GD time / PPRS time to eps (ratio)")
    ax.set_title("GD/PPRS time to eps: measured, and predicted two ways", fontsize=9)
    legend_outside(ax)
    save_figure(fig, outdir, "depth.png", res)
    res.tables.append(
        (
            "crossover depth Delta* and saturation of the GD/PPRS ratio",
            [
                "setting",
                "x",
                "d",
                "Delta* measured",
                "Delta* bounds",
                "Delta* iterations",
                "Delta* iterations, range over depths",
                "ratio at largest depth",
                "predicted (bounds)",
                "predicted (iterations)",
                "saturation T_GD/T_PPRS (bounds)",
                "saturation I_GD/I_PPRS (measured)",
            ],
            table,
        )
    )
