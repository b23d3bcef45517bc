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

from hpcpipe.pipeline.schedules import SCHEDULES
from hpcpipe.studies.common import StudyResult, Verdict, figure, files_of, linfit, save_figure

NAME = "pipeline-time"
TOL = {"model": 1e-9, "wall": 0.10}


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
        key = (r.config["schedule"], r.config["clock"], per_stage, r.config["layer_time"])
        groups[key].append(r)
    rows = []
    plt = figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    for (sched, clock, _per_stage, lt), g in sorted(groups.items()):
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
    """Depth speed-up of each schedule with a closed form over sequential: n·S/slots.

    For the fill-drain schedules the ratio is n·S/(n + S − 1).
    """
    seq = {}
    for (sched, clock, per_stage, lt), g in groups.items():
        for r in g:
            key = (clock, per_stage, lt, _n_items(r), r.n_ranks)
            if sched == "sequential":
                seq[key] = r
    by_sched: dict[str, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
    for (sched, clock, per_stage, lt), g in sorted(groups.items()):
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
            devs.append((abs(got - want) / want, TOL[clock]))
            files += [s.file, r.file]
    for sched, (rows, devs, files) in by_sched.items():
        if not rows:
            continue
        ok = all(d <= t for d, t in devs)
        want_text = f"{_law('sequential')}/({_law(sched)})"
        res.verdicts.append(
            Verdict(
                NAME,
                f"speed-up of {sched} over sequential = {want_text}",
                "relative deviation within the clock's tolerance",
                f"max dev {max(d for d, _ in devs):.2e} over {len(rows)} pairs",
                ok,
                sorted(files),
            )
        )
        res.tables.append(
            (
                f"depth speed-up of {sched}",
                ["sequential file", f"{sched} file", "clock", "n", "S", "measured", want_text],
                rows,
            )
        )
