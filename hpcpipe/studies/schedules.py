"""The schedule study: which pipeline schedule gives PPRS its largest advantage over GD.

Data: one run per (x, method) (``schedules_runs``): I_GD and I_PPRS, the iterations to
ε of the depth study's tuned GD and PPRS on ``nesterov-chain`` at x = RL/ε, and PPRS's
K. The iterates do not depend on the schedule, nor on Δ on this chain; only an
iteration's pipeline time does. So for every built-in schedule and depth Δ (one layer
per stage, S = Δ stages on Δ/v ranks for a schedule placing v stages per rank), on the
model clock with t_F = 1τ, t_B = 2τ per layer (t_I = t_W = 1τ, ``split_backward``) and
no message cost:

* T_m(Δ), the simulator's makespan of one call of method m (n = 1 item for GD, n = K
  for PPRS; m = 1 example), against the schedule's closed form where it has one in
  its regime (``schedules.SCHEDULES``): a consistency row per schedule (equal by
  construction when both are right);
* time to ε = I_m · T_m(Δ), and the GD/PPRS ratio;
* Δ* per schedule, the depth where the ratio crosses 1: measured on the simulator's
  times over the grid (``depth.crossover``, log-log interpolated) and predicted from
  the closed forms at every depth the schedule can take (a consistency check: within a
  factor 2, as the depth study's);
* which pipelined schedule gives PPRS the largest GD/PPRS ratio at the deepest depth,
  and by how much against GPipe.

The claim row: at the deepest depth PPRS reaches ε sooner than GD under every pipelined
schedule that runs both (``sequential`` has no pipelining: it is reported, not
judged). It fails when PPRS pays the depth once per sample (the planted fault
``depth-per-sample``: PPRS timed on ``sequential``; tested). A schedule the builder
refuses at a (Δ, n) has no cell there, and the tables say so: interleaved 1F1B (v = 2)
runs its items in rounds of g = n / max(1, ⌊n/P⌋) on P = Δ/2 ranks, so GD's single
item is one round at every depth, but PPRS's K items need ⌊K/P⌋ to divide K (K = 15
on P = 2, Δ = 4, cannot). With n < P it is GPipe on Δ stages ((vP + n − 1) slots).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.schedules import OutsideRegime, ScheduleError
from hpcpipe.pipeline.simulator import simulate
from hpcpipe.studies.common import COLORS, StudyResult, Verdict, figure, save_figure
from hpcpipe.studies.depth import crossover, crossover_of_times

NAME = "schedules"
T_F, T_B = 1.0, 2.0  # τ per layer (t_I = t_W = 1τ)
DEPTHS = tuple(2**k for k in range(2, 11))  # Δ = S = 4 … 1024
BASELINE = "sequential"  # no pipelining: reported, not judged
FAULTS = ("depth-per-sample",)


def builtin_names() -> list[str]:
    return [n for n in schedules.SCHEDULES.names() if ":" not in n]


@functools.lru_cache(maxsize=64)
def stages_per_rank(name: str) -> int:
    """v: the stages a schedule places on each rank (1, or 2 for interleaved and V)."""
    sch = schedules.build(name, 1, 1)
    return sch.n_stages // sch.n_ranks


@functools.lru_cache(maxsize=4096)
def iteration_time(name: str, depth: int, n: int) -> tuple[float, float] | None:
    """(simulated, closed-form) pipeline time of one call of ``n`` items through ``depth``
    one-layer stages; the closed form is NaN outside its regime; None when the schedule
    cannot run there (its builder refuses, or Δ is not a multiple of v). The schedule is
    validated first: a W before its I is refused (ScheduleError). Cached per process
    (the registry's built-ins do not change)."""
    v = stages_per_rank(name)
    if depth % v:
        return None
    P = depth // v
    try:
        sch = schedules.build(name, P, n)
    except ScheduleError:
        return None
    sch.validate()
    S = sch.n_stages
    sim = simulate(sch, [T_F] * S, [T_B] * S).makespan
    cf = schedules.entry(name).closed_form
    closed = math.nan
    if cf is not None:
        try:
            closed = float(cf(P, n, T_F, T_B, 0.0))
        except OutsideRegime:
            pass
    return sim, closed


def closed_ratio(name: str, depth: int, counts: tuple[float, float, int]) -> float:
    """GD/PPRS time to ε from the closed forms at ``depth`` (NaN where one does not apply)."""
    i_gd, i_pp, K = counts
    cf = schedules.entry(name).closed_form
    v = stages_per_rank(name)
    if cf is None or depth % v:
        return math.nan
    try:
        return i_gd * cf(depth // v, 1, T_F, T_B, 0.0) / (i_pp * cf(depth // v, K, T_F, T_B, 0.0))
    except (OutsideRegime, ScheduleError, ZeroDivisionError):
        return math.nan


def table(counts: tuple[float, float, int], names, depths=DEPTHS, fault: str = "") -> list[dict]:
    """One cell per (schedule, Δ): per-iteration times, closed forms, times to ε, ratio.

    ``fault = "depth-per-sample"`` plants a PPRS that pays the depth once per sample (its
    calls timed on ``sequential``), for the planted-fault test."""
    if fault and fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: choose one of {', '.join(FAULTS)}")
    i_gd, i_pp, K = counts
    cells = []
    for name in names:
        for D in depths:
            gd = iteration_time(name, D, 1)
            pp = iteration_time(BASELINE if fault else name, D, K)
            if gd is None or pp is None:
                cells.append(dict(schedule=name, depth=D, runs=False))
                continue
            t_gd, t_pp = i_gd * gd[0], i_pp * pp[0]
            cells.append(
                dict(
                    schedule=name, depth=D, runs=True, gd=gd[0], gd_cf=gd[1], pprs=pp[0],
                    pprs_cf=pp[1], time_gd=t_gd, time_pprs=t_pp, ratio=t_gd / t_pp,
                )
            )  # fmt: skip
    return cells


def crossovers(cells, counts, name: str) -> tuple[float, float]:
    """(measured Δ* on the grid's simulated times, predicted Δ* from the closed forms at
    every depth from the grid's first to its last the schedule can take)."""
    mine = [c for c in cells if c["schedule"] == name and c["runs"]]
    measured = crossover_of_times(
        [c["depth"] for c in mine], [c["time_gd"] for c in mine], [c["time_pprs"] for c in mine]
    )
    if not mine:
        return math.nan, math.nan
    lo, hi = min(c["depth"] for c in cells), max(c["depth"] for c in cells)
    v = stages_per_rank(name)
    dense = [(D, closed_ratio(name, D, counts)) for D in range(lo, hi + 1) if D % v == 0]
    dense = [(D, q) for D, q in dense if math.isfinite(q)]
    if len(dense) < 2:
        return measured, math.nan
    return measured, crossover([d for d, _ in dense], [q for _, q in dense])


def _agree(measured: float, predicted: float) -> bool:
    if not math.isfinite(predicted) and not math.isfinite(measured):
        return True
    if not (math.isfinite(predicted) and math.isfinite(measured)):
        return False
    return predicted / 2 <= measured <= 2 * predicted


def _counts(records) -> dict[float, tuple[float, float, int, list[str]]]:
    """Per x: (I_GD, I_PPRS, K, files) from the runs (only x with both methods)."""
    got: dict[float, dict] = {}
    for r in records:
        tag = str(r.config.get("tag", ""))
        if not tag.startswith(f"{NAME}/x="):
            continue
        x = float(tag.split("=", 1)[1])
        opt = str(r.config.get("optimizer", ""))
        it, _ = r.first_reach(float(r.config["epsilon"]))
        got.setdefault(x, {})[opt] = (it, int(r.config.get("samples", 1) or 1), r.file)
    out = {}
    for x, m in got.items():
        if "gd" in m and "pprs" in m:
            out[x] = (m["gd"][0], m["pprs"][0], m["pprs"][1], [m["gd"][2], m["pprs"][2]])
    return out


def study(records, outdir: Path, fault: str = "", names=None, depths=DEPTHS) -> StudyResult:
    res = StudyResult(NAME)
    counts = _counts(records)
    if not counts:
        return res
    names = list(names or builtin_names())
    judged = [n for n in names if n != BASELINE]
    per_x = {}
    for x, (i_gd, i_pp, K, files) in sorted(counts.items()):
        c3 = (i_gd, i_pp, K)
        if not (math.isfinite(i_gd) and math.isfinite(i_pp)):
            res.verdicts.append(
                Verdict(NAME, f"x = {x:g}: both methods reach ε", "I_GD, I_PPRS finite",
                        f"I_GD = {i_gd:g}, I_PPRS = {i_pp:g}", False, files, kind="design")
            )  # fmt: skip
            continue
        cells = table(c3, names, depths, fault)
        per_x[x] = (cells, c3, files)
        _rows(res, x, cells, c3, files, names, judged, fault)
    if per_x:
        _figure(res, outdir, per_x, names)
        res.notes.append(
            f"Model clock: t_F = {T_F:g}τ, t_B = {T_B:g}τ per layer (t_I = t_W = 1τ), no "
            "message cost, one layer per stage, Δ = S; a schedule with v stages per rank "
            "runs on Δ/v ranks. Iterations to ε from one run per (x, method) at Δ = 4 "
            "(GPipe): the iterates do not depend on the schedule or on Δ, only the time "
            "per iteration does (tested on a small case)."
        )
    return res


def _rows(res, x, cells, counts, files, names, judged, fault) -> None:
    i_gd, i_pp, K = counts
    ran = [c for c in cells if c["runs"]]
    # consistency, per schedule: simulator = closed form wherever the closed form applies
    for name in names:
        mine = [c for c in ran if c["schedule"] == name]
        pairs = [(c[k], c[k + "_cf"]) for c in mine for k in ("gd", "pprs")]
        pairs = [(s, f) for s, f in pairs if math.isfinite(f)]
        if not pairs:
            continue  # no closed form in its regime here (the table says n/a)
        worst = max(abs(s - f) / max(abs(f), 1e-300) for s, f in pairs)
        res.verdicts.append(
            Verdict(
                NAME, f"x = {x:g}, {name}: pipeline time per iteration, simulator = closed form",
                "relative difference <= 1e-12 where the closed form applies",
                f"{len(pairs)} of {2 * len(mine)} calls (GD and PPRS at each depth it runs) "
                f"have the closed form in its regime; largest difference {worst:.1e}",
                worst <= 1e-12, files, kind="consistency", executor="simulated",
            )
        )  # fmt: skip
    deepest = {}
    rows = []
    for name in names:
        mine = [c for c in ran if c["schedule"] == name]
        measured, predicted = crossovers(cells, counts, name)
        last = mine[-1] if mine else None
        deepest[name] = last
        rows.append([
            name, stages_per_rank(name),
            _depth(measured), _depth(predicted),
            f"{last['ratio']:.3g} at Δ = {last['depth']}" if last else "does not run",
            ", ".join(str(c["depth"]) for c in cells if c["schedule"] == name and not c["runs"])
            or "-",
        ])  # fmt: skip
        if name in judged and mine and math.isfinite(predicted):
            res.verdicts.append(
                Verdict(
                    NAME, f"x = {x:g}, {name}: Δ* measured (simulator) vs the closed forms",
                    "within a factor 2",
                    f"measured {_depth(measured)}, predicted {_depth(predicted)}",
                    _agree(measured, predicted), files, kind="consistency",
                    executor="simulated",
                )
            )  # fmt: skip
    res.tables.append((
        f"x = {x:g}: crossover per schedule (I_GD = {i_gd:g}, I_PPRS = {i_pp:g}, K = {K})",
        ["schedule", "stages per rank", "Δ* measured", "Δ* predicted (closed forms)",
         "GD/PPRS at the deepest depth", "depths it cannot run"],
        rows,
    ))  # fmt: skip
    res.tables.append((
        f"x = {x:g}: time to ε per schedule and depth (τ)",
        ["schedule", "Δ", "T_GD / iter", "T_PPRS / iter", "GD time to ε", "PPRS time to ε",
         "GD/PPRS"],
        [[c["schedule"], c["depth"], c["gd"], c["pprs"], c["time_gd"], c["time_pprs"],
          c["ratio"]] for c in ran],
    ))  # fmt: skip
    judged_last = {n: deepest[n] for n in judged if deepest.get(n) is not None}
    if not judged_last:
        return
    D = max(c["depth"] for c in judged_last.values())
    at_d = {n: c for n, c in judged_last.items() if c["depth"] == D}
    wins = {n: c["ratio"] > 1 for n, c in at_d.items()}
    measured = ", ".join(f"{n} {c['ratio']:.3g}" for n, c in at_d.items())
    res.verdicts.append(
        Verdict(
            NAME,
            f"x = {x:g}: PPRS reaches ε sooner than GD at the deepest depth under every "
            "pipelined schedule" + (f" (planted fault: {fault})" if fault else ""),
            f"GD/PPRS time to ε > 1 at Δ = {D}",
            f"GD/PPRS: {measured}",
            all(wins.values()), files, kind="claim", executor="simulated",
        )
    )  # fmt: skip
    top_name, top = max(at_d.items(), key=lambda t: t[1]["ratio"])
    gp = at_d.get("gpipe")
    vs = f"; GPipe {gp['ratio']:.4g}, so {top['ratio'] / gp['ratio']:.4g}x GPipe's" if gp else ""
    res.verdicts.append(
        Verdict(
            NAME, f"x = {x:g}: the schedule that gives PPRS its largest advantage",
            f"largest GD/PPRS at Δ = {D}",
            f"{top_name}: GD/PPRS = {top['ratio']:.4g}{vs}",
            None, files, kind="claim", executor="simulated",
        )
    )  # fmt: skip


def _depth(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    return "never" if not math.isfinite(v) else f"{v:.3g}"


def _figure(res, outdir: Path, per_x: dict, names) -> None:
    plt = figure()
    fig, axes = plt.subplots(1, len(per_x), figsize=(6.2 * len(per_x), 4.6), squeeze=False)
    for ax, (x, (cells, _, _)) in zip(axes[0], sorted(per_x.items())):
        for k, name in enumerate(names):
            mine = [c for c in cells if c["schedule"] == name and c["runs"]]
            if not mine:
                continue
            d = np.array([c["depth"] for c in mine])
            color = COLORS[k % len(COLORS)]
            ax.plot(d, [c["time_gd"] for c in mine], "--", color=color, label=f"GD, {name}")
            ax.plot(d, [c["time_pprs"] for c in mine], "-", color=color, label=f"PPRS, {name}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("depth Δ (stages)")
        ax.set_ylabel("time to ε (τ)")
        ax.set_title(f"x = RL/ε = {x:g}")
        ax.legend(fontsize=6, ncol=2)
    save_figure(fig, outdir, "schedules.png", res)


__all__ = ["NAME", "crossovers", "iteration_time", "study", "table"]
