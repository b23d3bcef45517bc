"""What the studies share: records from result files, fits, verdicts."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcpipe.optional import need
from hpcpipe.run import atomic
from hpcpipe.run.results import Result, load_dir


@dataclass
class Record:
    """The numbers of one result file a study needs."""

    file: str
    config: dict
    method: dict
    problem: dict
    status: str
    it: dict[str, np.ndarray]
    n_ranks: int
    info: dict
    executor: str = "mpi"  # "simulated": the simulated pipeline; "mpi": measured on MPI ranks
    machine: str = ""  # the machine profile's TOML text the run's model costs came from

    @property
    def per_iteration_time(self) -> np.ndarray:
        """Pipeline time of each iteration's oracle call (diff of the cumulative column)."""
        t = self.it["pipeline_time"]
        return np.diff(np.concatenate([[0.0], t]))

    @property
    def iteration_time(self) -> float:
        """Median per-iteration pipeline time, without the first call (one-time setup)."""
        d = self.per_iteration_time
        return float(np.median(d[1:] if len(d) > 1 else d))

    def first_reach(self, eps: float, column: str = "gap") -> tuple[float, float]:
        """(iterations, pipeline time) at the first row whose ``column`` is <= eps (by
        default the first iterate with f − f* <= eps); NaN if never."""
        gap = self.it[column]
        hit = np.flatnonzero(np.isfinite(gap) & (gap <= eps))
        if hit.size == 0:
            return math.nan, math.nan
        i = int(hit[0])
        return float(self.it["iteration"][i]), float(self.it["pipeline_time"][i])


def record(r: Result) -> Record:
    return Record(
        file=r.path.name,
        config=r.config,
        method=json.loads(r.attrs.get("method", "{}")),
        problem=json.loads(r.attrs.get("problem", "{}")),
        status=r.status,
        it=r.iterations,
        n_ranks=int(r.attrs.get("n_ranks", 1)),
        info=r.info,
        executor=str(r.attrs.get("executor", r.config.get("executor", "mpi"))),
        machine=str(r.attrs.get("machine_profile", "")),
    )


def load_records(directory: str | Path, warn=None) -> list[Record]:
    return [record(r) for r in load_dir(directory, warn=warn)]


def machine_load(records) -> tuple[float, int] | None:
    """The highest 1-minute load average recorded at the start or end of the runs and the
    fewest cores they had; None when a run did not record them (files written before
    runs recorded their load)."""
    loads, cores = [], []
    for r in records:
        info = r.info or {}
        if "load_start" not in info or "cores" not in info:
            return None
        loads += [float(info["load_start"]), float(info.get("load_end", info["load_start"]))]
        cores.append(int(info["cores"]))
    if not loads:
        return None
    return max(loads), min(cores)


def foreign_load(records) -> float | None:
    """The most CPU (cores) other processes used during any of the runs
    (``machine.foreign``); None when a run did not record it (older files, or a platform
    without ``/proc/stat``)."""
    vals = []
    for r in records:
        v = (r.info or {}).get("foreign_cpu")
        if v is None or not math.isfinite(float(v)):
            return None
        vals.append(float(v))
    return max(vals) if vals else None


def load_check(records, rerun: str) -> tuple[str, str]:
    """(the load for a wall-clock row's measured column, why the row is not enforced).

    A wall-clock figure measured while the machine was busy says how busy the machine
    was, not what the model predicts: such a row is "not enforced", with the load and how
    to rerun, never failed for the noise and never passed.

    Busy: other processes used more than ``foreign.BUSY_SHARE`` of the cores during any
    of the row's runs (``foreign_cpu``, measured by each run: the host's busy CPU time
    less the job's own). The load average is printed beside it but does not decide: it
    counts the job's own ranks (32 polling ranks on 2 cores hold it near 32) and lags a
    minute behind. Runs that did not record ``foreign_cpu`` are judged by the 1-minute
    load average at their start and end (above the cores: busy). Rows of runs that
    recorded neither stay enforced ("load not recorded").
    """
    from hpcpipe.machine.foreign import BUSY_SHARE, busy

    got = machine_load(records)
    if got is None:
        return "load not recorded", ""
    load, cores = got
    foreign = foreign_load(records)
    if foreign is not None:
        text = (
            f"other processes {max(foreign, 0.0):.2f} of {cores} cores "
            f"(load average {load:.2f}, the job's own ranks included)"
        )
        if busy(foreign, cores):
            why = f"{text}: busy machine (above {BUSY_SHARE:g} of the cores)"
            return text, f"{why}; rerun on an idle one: {rerun}"
        return text, ""
    text = f"load {load:.2f} on {cores} cores"
    if load > cores:
        return text, f"{text}: busy machine; rerun on an idle one: {rerun}"
    return text, ""


@dataclass
class Verdict:
    study: str
    claim: str
    bound: str
    measured: str
    ok: bool | None  # None: reported, not a bound (e.g. a paper claim)
    files: list[str]
    kind: str = "bound"  # "bound", "consistency", "design" set the exit status; "claim" does not
    executor: str = ""  # where the numbers come from: "simulated", "mpi", or both
    # why a wall-clock row is not judged (the machine was busy; ``load_check``); ok is None
    not_enforced: str = ""
    inconclusive: bool = False  # with ok None: an equivalence test that could not decide

    @property
    def word(self) -> str:
        if self.not_enforced:
            return f"not enforced ({self.not_enforced})"
        if self.ok is None:
            return "inconclusive" if self.inconclusive else "reported"
        if self.kind == "claim":
            return "reproduced" if self.ok else "not reproduced"
        if self.kind == "design":  # the study met its own design (reported, not enforced)
            return "design met" if self.ok else "DESIGN NOT MET"
        if self.kind == "consistency":
            return "consistent" if self.ok else "INCONSISTENT"
        return "within bound" if self.ok else "VIOLATED"


@dataclass
class StudyResult:
    name: str
    verdicts: list[Verdict] = field(default_factory=list)
    tables: list[tuple[str, list[str], list[list]]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def equivalence(lo: float, hi: float, target: float, delta: float) -> bool | None:
    """An equivalence test of a fitted value against ``target``, from its interval [lo, hi].

    True when the interval lies inside target ± δ (the value is target to within δ, even
    if the interval excludes target: equivalence is what is tested); False when it
    excludes target otherwise; None (inconclusive) in the remaining case: the interval
    holds target but reaches outside the band, as every interval wider than 2δ does.
    A small study therefore cannot pass by having a wide interval (the rule "the
    interval contains target" rewards it), and an interval that is not finite (too
    few points) is inconclusive. This is the two one-sided tests' decision
    (Schuirmann 1987) at the interval's level, with "excludes target" as the rejection.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if target - delta <= lo and hi <= target + delta:
        return True
    # an end within rounding of the target holds it: a bootstrap of points that differ in
    # one factor only gives the exact slope, computed as 1 ± 2e-16 depending on the CPU
    tol = 1e-12 * max(1.0, abs(target))
    if hi < target - tol or lo > target + tol:
        return False
    return None


def equivalence_verdict(
    study: str,
    claim: str,
    what: str,
    target: float,
    delta: float,
    fit: tuple[float, float, float],
    detail: str,
    files: list[str],
    kind: str = "claim",
    why: str = "",
) -> Verdict:
    """A fitted-exponent row decided by ``equivalence``: the bound states the rule and δ, the
    measurement the fit (value [lo, hi]) beside the prediction."""
    p, lo, hi = fit
    ok = equivalence(lo, hi, target, delta)
    return Verdict(
        study,
        claim,
        f"predicted {what} {target:g}{why}; equivalence test with delta = {delta:g}: reproduced "
        f"when the 95% interval lies inside [{target - delta:g}, {target + delta:g}], not "
        f"when it excludes {target:g}, inconclusive otherwise",
        f"{what} {p:.3f} [{lo:.3f}, {hi:.3f}] (predicted {target:g}){detail}",
        ok,
        files,
        kind=kind,
        inconclusive=ok is None,
    )


def linfit(x, y) -> tuple[float, float, float]:
    """Least squares y = a·x + b; returns (a, b, R²)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    A = np.column_stack([x, np.ones_like(x)])
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - (a * x + b)) ** 2).sum()) / ss if ss > 0 else 1.0
    return float(a), float(b), r2


def loglog_slope(x, y, boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Slope of log y on log x, with a 95% bootstrap interval (resampling points)."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    slope = float(np.polyfit(lx, ly, 1)[0])
    g = np.random.default_rng(seed)
    n = len(lx)
    sl = []
    for _ in range(boot):
        idx = g.integers(0, n, n)
        if np.ptp(lx[idx]) == 0:
            continue
        sl.append(np.polyfit(lx[idx], ly[idx], 1)[0])
    lo, hi = np.percentile(sl, [2.5, 97.5]) if sl else (math.nan, math.nan)
    return slope, float(lo), float(hi)


def spot_agreement(spots, reference, columns=("loss",)) -> tuple[int, int, list[str], int]:
    """MPI spot runs against the simulated runs of the same configuration.

    ``reference(spot)`` is the simulated record or None. A pair agrees when the
    pipeline times are bitwise equal and ``columns`` agree to 1e-9 (relative) over
    the spot run's iterations. Returns (agreeing, pairs, files that disagree,
    iterations compared).
    """
    agree, pairs, bad, k = 0, 0, [], 0
    for s in spots:
        ref = reference(s)
        if ref is None:
            continue
        pairs += 1
        k = len(s.it["iteration"])
        same_t = np.array_equal(s.it["pipeline_time"], ref.it["pipeline_time"][:k])
        same = all(np.allclose(s.it[c], ref.it[c][:k], rtol=1e-9, atol=1e-12) for c in columns)
        if same_t and same:
            agree += 1
        else:
            bad.append(s.file)
    return agree, pairs, bad, k


def figure():
    """matplotlib.pyplot on the Agg backend (MissingExtra naming the ``plot`` extra without it)."""
    matplotlib = need("matplotlib", "plot", "a figure")
    matplotlib.use("Agg")
    return need("matplotlib.pyplot", "plot", "a figure")


# 10 colours and 9 markers: a (colour, marker) pair repeats only after 90 series
COLORS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")


def series_style(i: int) -> dict:
    """Colour and marker of the i-th series: distinct, and hollow on odd i so that a series
    drawn on top of another leaves it visible."""
    c = COLORS[i % len(COLORS)]
    return {
        "color": c,
        "marker": MARKERS[i % len(MARKERS)],
        "markerfacecolor": "none" if i % 2 else c,
        "markersize": 6 if i % 2 else 5,
    }


LEGEND_ROWS = 18  # entries per legend column that fit beside a 4.6-inch-high figure


def legend_outside(ax) -> None:
    """The legend to the right of the axes, where it can cover no curve; in columns of at
    most LEGEND_ROWS entries, so that a long one is not cut off below the figure."""
    n = len(ax.get_legend_handles_labels()[0])
    ncol = max(1, -(-n // LEGEND_ROWS))
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False, ncol=ncol)


def save_figure(fig, outdir: Path, name: str, res: StudyResult) -> None:
    """Write a study's figure as PNG next to the report and list it in the study."""
    plt = need("matplotlib.pyplot", "plot", "a figure")
    fig.tight_layout()
    try:
        atomic.write(outdir / name, lambda tmp: fig.savefig(tmp, dpi=110))  # whole or nothing
    finally:
        plt.close(fig)
    res.figures.append(name)


def files_of(recs) -> list[str]:
    return sorted(r.file for r in recs)


def mpi_equals_simulated(study: str, recs, key) -> Verdict | None:
    """Consistency row: each MPI run equals the simulated run of the same ``key(record)``
    on the model clock (pipeline time bitwise, loss to 1e-9, over the MPI run's rows).
    None when no MPI run has a simulated twin."""
    sims = {key(r): r for r in recs if r.executor == "simulated"}
    pairs, bad = [], []
    for s in (r for r in recs if r.executor == "mpi"):
        ref = sims.get(key(s))
        if ref is None:
            continue
        k = len(s.it["iteration"])
        pairs.append(s)
        same_t = np.array_equal(s.it["pipeline_time"], ref.it["pipeline_time"][:k])
        same_f = np.allclose(s.it["loss"], ref.it["loss"][:k], rtol=1e-9, atol=1e-12)
        if not (same_t and same_f):
            bad.append(s.file)
    if not pairs:
        return None
    return Verdict(
        study,
        "MPI spot checks (model clock) = simulated runs",
        "pipeline time bitwise, loss to 1e-9, same configuration",
        f"{len(pairs) - len(bad)}/{len(pairs)} runs agree",
        not bad,
        sorted(bad) or files_of(pairs),
        kind="consistency",
        executor="mpi + simulated",
    )


def row_table(title: str, rows: list[dict], keys: list[str], order: list[str]) -> tuple:
    """A report table of per-run dicts: the ``keys`` columns and the file, sorted by ``order``."""
    ordered = sorted(rows, key=lambda w: tuple(w[k] for k in order))
    return title, [*keys, "file"], [[w[k] for k in keys] + [w["file"]] for w in ordered]


def depth_ratio_figure(
    series: list[tuple[str, list[float], list[float], str]],
    line: str,
    ylabel: str,
    title: str,
):
    """A figure of ratios against depth on log-log axes, one (label, depths, ratios, style)
    per series (style "-": measured, ":": a bound, in the colour of the series before
    it), with the reference level 1 labelled ``line``; the caller saves it."""
    plt = figure()
    # the legend (one entry per series and the reference line) stands right of the axes
    # in columns of LEGEND_ROWS: the figure widens with them, so the axes keep their width
    ncol = max(1, -(-(len(series) + 1) // LEGEND_ROWS))
    fig, ax = plt.subplots(figsize=(5.0 + 3.2 * ncol, 4.6))
    i = -1
    for label, depths, ratios, style in series:
        if style == "-":
            i += 1
            ax.loglog(depths, ratios, "-", label=label, **series_style(i))
        else:
            ax.loglog(depths, ratios, style, color=series_style(max(i, 0))["color"], label=label)
    ax.axhline(1.0, color="k", ls="--", lw=1, label=line)
    ax.set_xlabel("depth (layers = stages)")
    ax.set_ylabel(ylabel)
    fig.suptitle(title)  # over the whole figure: a long title is not cut at the axes' edge
    legend_outside(ax)
    return fig
