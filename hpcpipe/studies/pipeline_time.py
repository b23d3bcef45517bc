"""Study 1: iteration time against K, m and Δ: T_iter = a·(K·m + S − 1) + b.

With S stages (one per rank), K samples of m examples (one example per work
item, n = K·m items), the fill-drain schedules cost (n + S − 1) slots per
direction; sequential costs n·S. On the model clock the law is exact (a
consistency check of the clock against the schedule's closed form); on the wall
clock with emulated layers it should hold within 10%.

Wall-clock runs made with a machine profile (``machine =``, one per rank count,
calibrated first by ``hpcpipe calibrate --sweep``) are held against the calibrated
model in seconds: per run, measured / predicted iteration time within 1 ± 10%, the
prediction being the simulator's makespan of the run's schedule under the recorded
profile's costs (``calibrated.iteration_seconds``, the code the depth-wall study
uses). Wall-clock runs without a profile keep the uncalibrated check of the slope
per slot against 2·layer_time·(layers per stage), which leaves out the per-message
and per-action costs (docs/calibration.md).

Every wall-clock row records the machine's load at its runs, and is "not enforced"
(with the load and how to rerun) when the machine was busy (``common.load_check``)
or a profile was calibrated on a busy machine; never failed for noise, never passed.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from hpcpipe.pipeline.schedules import SCHEDULES
from hpcpipe.studies.calibrated import iteration_seconds
from hpcpipe.studies.common import (
    StudyResult,
    Verdict,
    figure,
    files_of,
    legend_outside,
    linfit,
    load_check,
    save_figure,
    series_style,
)

NAME = "pipeline-time"
TOL = {"model": 1e-9, "wall": 0.10}
RERUN = (
    "hpcpipe calibrate --sweep jobs/sweeps/pipeline-time.toml --force, hpcpipe sweep "
    "jobs/sweeps/pipeline-time.toml into a new --out, then hpcpipe analyze it"
)


def _n_items(r) -> int:
    m = int(r.config["m"])
    micro = int(r.config.get("microbatches", 0)) or m
    return int(r.method.get("samples", 1)) * micro


def slots(schedule: str, n, S):
    """Slots per direction of a schedule, from its registry closed form (None if it has none).

    n·S for sequential, n + S − 1 for the fill-drain schedules (t_F = 1, t_B = c = 0).
    """
    if SCHEDULES.check(schedule) is not None or SCHEDULES.get(schedule).closed_form is None:
        return None
    f = SCHEDULES.get(schedule).slots
    return np.array([f(int(a), int(b)) for a, b in zip(np.atleast_1d(n), np.atleast_1d(S))])


def _law(schedule: str) -> str:
    return SCHEDULES.get(schedule).law or f"{schedule} slots"


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
        key = (
            r.config["schedule"],
            r.config["clock"],
            per_stage,
            r.config["layer_time"],
            bool(r.machine),
        )
        groups[key].append(r)
    rows, fits = [], []
    for (sched, clock, _per_stage, lt, calibrated), g in sorted(groups.items()):
        n = np.array([_n_items(r) for r in g])
        S = np.array([r.n_ranks for r in g])
        T = np.array([r.iteration_time for r in g])
        x = slots(sched, n, S)
        if x is None:  # a schedule without a closed form has no law to test
            continue
        law = _law(sched)
        a, b, r2 = linfit(x, T)
        dev = float(np.max(np.abs(T - (a * x + b)) / T))
        tol = TOL[clock]
        ok = dev <= tol and (len(g) >= 3)
        load, busy = load_check(g, RERUN) if clock == "wall" else ("", "")
        model = clock == "model"
        res.verdicts.append(
            Verdict(
                NAME,
                f"{sched} iteration time follows a*({law}) + b ({clock} clock"
                + (f", emulated {lt * 1e3:g} ms/layer" if lt else "")
                + (", machine profile" if calibrated else "")
                + ("; a consistency check" if model else "")
                + ")",
                f"max relative deviation <= {tol:g} over >= 3 points",
                f"a = {a:.4g}, b = {b:.3g}, R^2 = {r2:.6f}, max dev = {dev:.2e}, {len(g)} points"
                + (f"; {load}" if load else ""),
                None if busy else ok,
                files_of(g),
                kind="consistency" if model else "bound",
                not_enforced=busy,
            )
        )
        if clock == "wall" and calibrated:
            res.verdicts.append(_calibrated(sched, lt, g, tol, load, busy))
        elif clock == "wall" and lt > 0:
            # the model's own slope: each action waits layer_time per layer it holds, so
            # a slot (one forward and one backward on a stage) costs 2·layer_time·Δ/S
            per = np.array([2 * lt * r.config["depth"] / r.n_ranks for r in g])
            ratio = float(np.median(a / per))
            res.verdicts.append(
                Verdict(
                    NAME,
                    f"{sched} wall-clock slope per slot against the uncalibrated model's "
                    f"(emulated {lt * 1e3:g} ms/layer, no machine profile recorded)",
                    f"measured/model per slot within 1 +- {tol:g}; the model's slope "
                    "2*layer_time*(layers per stage), not a free fit",
                    f"measured {a * 1e3:.4g} ms/slot, model {float(np.median(per)) * 1e3:.4g} "
                    f"ms/slot: ratio {ratio:.3f}; {load}",
                    None if busy else abs(ratio - 1) <= tol,
                    files_of(g),
                    not_enforced=busy,
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
        fits.append((sched, clock, lt, x, T, a, b, tol))
    _figure(res, fits, outdir)
    res.tables.append(
        (
            "iteration times",
            ["file", "schedule", "clock", "K", "m", "S", "slots", "T_iter", "fit"],
            rows,
        )
    )
    _speedup(res, groups)
    return res


def _calibrated(sched: str, lt: float, g, tol: float, load: str, busy: str) -> Verdict:
    """Per run: the measured wall-clock iteration time over the calibrated model's.

    The prediction is ``calibrated.iteration_seconds``: the simulator's makespan of the
    run's schedule under its recorded machine profile (no free parameter). Not enforced
    when the machine was busy at the runs or a profile was calibrated on a busy one.
    """
    from hpcpipe.errors import ConfigError
    from hpcpipe.machine.profile import parse

    emulated = f"emulated {lt * 1e3:g} ms/layer" if lt else "real layer compute"
    claim = f"{sched} wall-clock iteration time = the calibrated model's ({emulated})"
    bound = (
        f"measured/predicted within 1 +- {tol:g} for every run; predicted: the simulator "
        "under the run's machine profile (layer times, emulated action, action overhead, "
        "alpha + bytes*beta), not a fit"
    )
    try:
        ratios = [r.iteration_time / iteration_seconds(r) for r in g]
    except ConfigError as e:  # e.g. a result made before runs recorded their model
        why = f"no calibrated prediction: {e}"
        return Verdict(NAME, claim, bound, why, None, files_of(g), not_enforced=why)
    notes = sorted({note for note in (parse(r.machine).busy_note for r in g) if note})
    if notes:
        load += (
            f"; {len({r.machine for r in g if parse(r.machine).busy_note})} profile(s) {notes[0]}"
        )
        if not busy:
            busy = f"profile {notes[0]}; rerun on an idle machine: {RERUN}"
    worst = max(ratios, key=lambda q: abs(q - 1))
    return Verdict(
        NAME,
        claim,
        bound,
        f"ratios {min(ratios):.3f}..{max(ratios):.3f} (worst {worst:.3f}, median "
        f"{float(np.median(ratios)):.3f}) over {len(ratios)} runs; {load}",
        None if busy else all(abs(q - 1) <= tol for q in ratios),
        files_of(g),
        not_enforced=busy,
    )


UNITS = {"model": "tau", "wall": "s"}


def _figure(res: StudyResult, fits, outdir: Path) -> None:
    """One column per clock: iteration time against the slots with the fitted law, and the
    relative residuals against that law with the verdict's tolerance band."""
    clocks = sorted({f[1] for f in fits})
    if not clocks:
        return
    plt = figure()
    fig, axes = plt.subplots(
        2,
        len(clocks),
        figsize=(5.2 * len(clocks) + 2.4, 6.2),
        squeeze=False,
        sharex="col",
        gridspec_kw={"height_ratios": [3, 1.4]},
    )
    for j, clock in enumerate(clocks):
        top, bottom = axes[0][j], axes[1][j]
        mine = [f for f in fits if f[1] == clock]
        for i, (sched, _clock, lt, x, T, a, b, _tol) in enumerate(mine):
            style = series_style(i)
            order = np.argsort(x)
            emu = f", {lt * 1e3:g} ms/layer" if lt else ""
            top.plot(x[order], T[order], linestyle="none", label=f"{sched}{emu}", **style)
            xx = np.linspace(0, x.max() * 1.05, 50)
            sign = "+" if b >= 0 else "-"
            top.plot(
                xx,
                a * xx + b,
                "-" if i % 2 == 0 else "--",
                lw=1,
                color=style["color"],
                label=f"fit {sched}: {a:.4g}*slots {sign} {abs(b):.3g}",
            )
            bottom.plot(x[order], ((T - (a * x + b)) / T)[order], linestyle="none", **style)
        tol = TOL[clock]
        bottom.axhspan(-tol, tol, color="0.9", zorder=0, label=f"tolerance +-{tol:g}")
        bottom.axhline(0, color="0.4", lw=0.8)
        top.set_title(f"{clock} clock")
        top.set_ylabel(f"iteration time ({UNITS[clock]})")
        top.set_xlim(left=0)
        top.set_ylim(bottom=0)
        bottom.set_ylabel("relative residual")
        bottom.set_xlabel("slots: K*m + S - 1 (sequential: n*S)")
        legend_outside(top)
        legend_outside(bottom)
    fig.suptitle("Pipeline time law: T_iter = a*slots + b, per schedule and clock")
    save_figure(fig, outdir, "pipeline_time.png", res)


def _speedup(res: StudyResult, groups) -> None:
    """Depth speed-up of each schedule with a closed form over sequential: n·S/slots.

    For the fill-drain schedules the ratio is n·S/(n + S − 1).
    """
    seq = {}
    for (sched, clock, per_stage, lt, _calibrated), g in groups.items():
        for r in g:
            key = (clock, per_stage, lt, _n_items(r), r.n_ranks)
            if sched == "sequential":
                seq[key] = r
    by_sched: dict[str, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
    for (sched, clock, per_stage, lt, _calibrated), g in sorted(groups.items()):
        if sched == "sequential" or slots(sched, 1, 1) is None:
            continue
        rows, devs, files = by_sched[sched]
        for r in g:
            key = (clock, per_stage, lt, _n_items(r), r.n_ranks)
            if key not in seq:
                continue
            s = seq[key]
            n, S = _n_items(r), r.n_ranks
            got = s.iteration_time / r.iteration_time
            want = float(slots("sequential", n, S)[0] / slots(sched, n, S)[0])
            rows.append([s.file, r.file, clock, n, S, got, want])
            devs.append((abs(got - want) / want, TOL[clock], clock, (s, r)))
            files += [s.file, r.file]
    for sched, (rows, devs, files) in by_sched.items():
        if not rows:
            continue
        wall = [pair for *_, clock, pair in devs if clock == "wall"]
        load, busy = load_check([x for pair in wall for x in pair], RERUN) if wall else ("", "")
        judged = [(d, t) for d, t, clock, _ in devs if not (busy and clock == "wall")]
        ok = all(d <= t for d, t in judged) if judged else None
        note = ""
        if wall and busy and judged:  # the model-clock pairs are judged, the others reported
            note, busy = f"; wall-clock pairs not enforced ({busy})", ""
        elif load:
            note = f"; wall clock: {load}"
        want_text = f"{_law('sequential')}/({_law(sched)})"
        res.verdicts.append(
            Verdict(
                NAME,
                f"speed-up of {sched} over sequential = {want_text}",
                "relative deviation within the clock's tolerance",
                f"max dev {max(d for d, *_ in devs):.2e} over {len(rows)} pairs{note}",
                None if busy else ok,
                sorted(files),
                not_enforced=busy,
            )
        )
        res.tables.append(
            (
                f"depth speed-up of {sched}",
                ["sequential file", f"{sched} file", "clock", "n", "S", "measured", want_text],
                rows,
            )
        )
