"""Study depth-wall: time to ε in seconds on real MPI ranks against the calibrated model.

The runs (tag ``depth-wall``): GD, AGD and PPRS on ``nesterov-chain``, one
layer per MPI rank (Δ ranks), GPipe, m = 1, wall clock, emulated layers
(``layer_time``, sleep), ``stop_at_epsilon = 1`` and ``machine`` = the
profile calibrated at Δ ranks (``hpcpipe calibrate --np Δ``). Per run:

* measured: the wall-clock pipeline time at which ε was first reached (the
  run stops there): the time to ε in seconds;
* predicted: the iterations to ε I × the calibrated model's pipeline time of
  one iteration of the study's design schedule (GPipe, n = K·m items):
  the simulator under the profile's costs (layer time at the width, the
  emulated action, the engine's action overhead, α + bytes·β of the run's
  wait policy), in seconds;
* τ clock: I × the closed form in τ (t_F = t_B = 1, no message cost).

Runs with real layer compute (``layer_time = 0``: the profile's measured
forward and backward times instead of the emulated action; on 2 cores only
at Δ = 2, a core per rank) are in the table and the bound row; the claim and
the figure use the emulated grid.

Rows:

* design (reported): the load average at the start and end of the runs;
* bound: measured / predicted within [0.9, 1.1] for every run (and every run
  reached ε); "not enforced (load L on C cores)" when the machine was busy
  (``common.load_check``);
* claim: "PPRS reaches ε before GD for Δ ≥ Δ*": at every Δ of the grid,
  PPRS's measured time is below GD's exactly when Δ is at or beyond the
  calibrated model's Δ*; measured Δ* (GD/PPRS measured seconds crossing 1,
  log-log interpolated), predicted Δ* (the same on the predicted seconds)
  and Δ* on the τ clock (``depth.law_crossover`` of the iteration counts)
  side by side.

The runs: ``jobs/sweeps/depth-wall.toml`` (x = 64, d = 256, the depth study's
tuned GD and PPRS, Δ = 2 … 32, one profile per Δ, calibrated first with
``hpcpipe calibrate --sweep``); ``analysis/reproduce.py --only depth-wall``
runs both. A profile calibrated on a busy machine (``machine.busy``) leaves
the bound row not enforced too, with its note: its costs are a busy machine's.

A planted fault fails its row: a profile with α × 10 (the prediction is then
far above the measurement: bound row), and the depth-per-sample pipeline
(PPRS on the sequential schedule pays Δ per sample: its measured seconds no
longer fall below GD's from the predicted Δ*: claim row).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from hpcpipe.studies.calibrated import iteration_seconds
from hpcpipe.studies.common import (
    StudyResult,
    Verdict,
    figure,
    files_of,
    legend_outside,
    load_check,
    save_figure,
    series_style,
)
from hpcpipe.studies.depth import crossover_of_times, law_crossover

NAME = "depth-wall"
BOUND = (0.9, 1.1)
METHODS = ("gd", "agd", "pprs")
RERUN = (
    "hpcpipe calibrate --sweep jobs/sweeps/depth-wall.toml --force, hpcpipe sweep "
    "jobs/sweeps/depth-wall.toml, then hpcpipe analyze --study depth-wall"
)


def applicable(r) -> bool:
    return r.config.get("clock") == "wall" and bool(r.machine)


def items(r) -> int:
    m = int(r.config.get("m", 1))
    return int(r.method.get("samples", 1)) * (int(r.config.get("microbatches", 0)) or m)


def per_iteration(r) -> float:
    """The calibrated model's seconds for one iteration of the design schedule (GPipe):
    ``calibrated.iteration_seconds`` of the run's profile and model."""
    return iteration_seconds(r, "gpipe")


def start_end(recs) -> str:
    """The 1-minute load at the start of the first run and the end of the last (file order:
    the sweep's order) and the range over all runs' starts and ends."""
    info = [r.info or {} for r in sorted(recs, key=lambda r: r.file)]
    if not all("load_start" in i for i in info):
        return "load at start and end not recorded"
    vals = [float(v) for i in info for v in (i["load_start"], i.get("load_end", i["load_start"]))]
    first, last = float(info[0]["load_start"]), float(info[-1].get("load_end", vals[-1]))
    return f"load at start {first:.2f}, at end {last:.2f} (runs: {min(vals):.2f}..{max(vals):.2f})"


def emulated(r) -> bool:
    """Emulated layers (``layer_time`` > 0), else real layer compute."""
    return float(r.config.get("layer_time", 0.0)) > 0


def calibrated_busy(r) -> str:
    """The run's profile's busy note ('' when it was calibrated on a quiet machine)."""
    from hpcpipe.machine.profile import parse

    return parse(r.machine).busy_note


def tau_per_iteration(r) -> float:
    """One GPipe iteration in τ units: 2(n + Δ − 1)."""
    return 2.0 * (items(r) + r.n_ranks - 1)


def to_epsilon(r) -> tuple[float, float]:
    """(iterations, wall seconds) when ε was first reached; NaN when never."""
    return r.first_reach(float(r.config["epsilon"]))


def study(records, outdir: Path) -> StudyResult:
    res = StudyResult(NAME)
    recs = [r for r in records if applicable(r) and len(r.it["iteration"]) > 0]
    if not recs:
        return res
    load, busy = load_check(recs, RERUN)
    noted = {r.machine: calibrated_busy(r) for r in recs}
    notes = sorted({note for note in noted.values() if note})
    if notes and not busy:
        busy = f"profile {notes[0]}; rerun on an idle machine: {RERUN}"
    if notes:
        n = sum(1 for note in noted.values() if note)
        load += f"; {n} of {len(noted)} profiles calibrated on a busy machine"
    res.verdicts.append(
        Verdict(
            NAME,
            "wall-clock runs on a quiet machine (other processes at most a quarter of the "
            "cores during every run; studies.common.load_check)",
            "other processes' CPU and the load average recorded by every run",
            f"{load}; {start_end(recs)}",
            None,
            files_of(recs),
            kind="design",
        )
    )
    by = defaultdict(list)
    rows, ratios = [], []
    for r in sorted(recs, key=lambda r: (r.config["optimizer"], r.n_ranks, r.file)):
        its, secs = to_epsilon(r)
        pred = its * per_iteration(r) if math.isfinite(its) else math.nan
        ratio = secs / pred if math.isfinite(pred) and pred > 0 else math.nan
        ratios.append(ratio)
        tau = its * tau_per_iteration(r)
        if emulated(r):  # the grid of the claim and figure; real compute is judged by the bound
            by[(r.config["optimizer"], r.n_ranks)].append((secs, pred, tau, its, items(r)))
        layers = "emulated" if emulated(r) else "real"
        rows.append([r.file, r.config["optimizer"], r.n_ranks, layers, its, secs, pred, ratio, tau])
    res.tables.append(
        (
            "time to epsilon: measured and predicted seconds",
            [
                "file",
                "method",
                "depth",
                "layers",
                "iterations",
                "measured s",
                "predicted s",
                "ratio",
                "tau",
            ],
            rows,
        )
    )
    finite = [q for q in ratios if math.isfinite(q)]
    within = len(finite) == len(ratios) and all(BOUND[0] <= q <= BOUND[1] for q in finite)
    span = f"{min(finite):.3f}..{max(finite):.3f}" if finite else "none"
    missed = len(ratios) - len(finite)
    res.verdicts.append(
        Verdict(
            NAME,
            "time to epsilon in seconds = iterations x the calibrated pipeline time",
            f"measured/predicted in [{BOUND[0]}, {BOUND[1]}] for every run",
            f"ratios {span} over {len(ratios)} runs"
            + (f", {missed} without epsilon" if missed else "")
            + f"; {load}",
            None if busy else within,
            files_of(recs),
            not_enforced=busy,
        )
    )
    _claim(res, by, recs, busy)
    _figure(res, by, outdir)
    return res


def _figure(res: StudyResult, by, outdir: Path) -> None:
    """Time to ε against depth per method: measured (markers) and predicted (lines), s."""
    plt = figure()
    fig, ax = plt.subplots(figsize=(7.6, 4.6))
    for i, method in enumerate(METHODS):
        ds = sorted(D for (m, D) in by if m == method)
        if not ds:
            continue
        style = series_style(i)
        meas = [_median([v[0] for v in by[(method, D)]]) for D in ds]
        pred = [_median([v[1] for v in by[(method, D)]]) for D in ds]
        ax.plot(ds, meas, linestyle="none", label=f"{method} measured", **style)
        ax.plot(ds, pred, "-", lw=1, color=style["color"], label=f"{method} predicted")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("depth Delta (MPI ranks, one layer each)")
    ax.set_ylabel("time to epsilon (s, wall clock)")
    ax.set_title("Time to epsilon: measured against the calibrated model")
    legend_outside(ax)
    save_figure(fig, outdir, "depth_wall.png", res)


def _median(values) -> float:
    v = [x for x in values if math.isfinite(x)]
    return float(statistics.median(v)) if v else math.nan


def _claim(res: StudyResult, by, recs, busy: str = "") -> None:
    depths = sorted({D for (m, D) in by if m in ("gd", "pprs")})
    pairs = [D for D in depths if ("gd", D) in by and ("pprs", D) in by]
    if not pairs:
        return
    med = {k: [_median(col) for col in zip(*v)] for k, v in by.items()}  # secs, pred, tau, I, n
    measured = [med[("gd", D)][0] / med[("pprs", D)][0] for D in pairs]
    predicted = [med[("gd", D)][1] / med[("pprs", D)][1] for D in pairs]
    d_meas = crossover_of_times(pairs, *([med[(m, D)][0] for D in pairs] for m in ("gd", "pprs")))
    d_pred = crossover_of_times(pairs, *([med[(m, D)][1] for D in pairs] for m in ("gd", "pprs")))
    i_gd = _median([med[("gd", D)][3] for D in pairs])
    i_pprs = _median([med[("pprs", D)][3] for D in pairs])
    K = int(_median([med[("pprs", D)][4] for D in pairs]))
    d_tau = law_crossover(i_gd, i_pprs, K)
    agree = all(math.isfinite(q) and (q > 1) == (D >= d_pred) for D, q in zip(pairs, measured))
    res.verdicts.append(
        Verdict(
            NAME,
            "PPRS reaches epsilon before GD for depth >= Delta*",
            "at every depth, PPRS is faster than GD exactly from the calibrated model's Delta*",
            f"Delta* measured {_fmt(d_meas)}, predicted (calibrated, s) {_fmt(d_pred)}, "
            f"tau clock {_fmt(d_tau)}; GD/PPRS measured "
            + ", ".join(f"{q:.3g}" for q in measured)
            + " at depth "
            + ", ".join(map(str, pairs)),
            None if busy else agree,
            files_of([r for r in recs if r.config["optimizer"] in ("gd", "pprs")]),
            kind="claim",
            not_enforced=busy,
        )
    )
    res.tables.append(
        (
            "GD/PPRS time ratio per depth",
            ["depth", "measured", "predicted"],
            [[D, a, b] for D, a, b in zip(pairs, measured, predicted)],
        )
    )


def _fmt(v: float) -> str:
    return "none on the grid" if not math.isfinite(v) else f"{v:.3g}"


__all__ = ["NAME", "per_iteration", "study"]
