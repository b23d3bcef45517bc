"""``hpcpipe demo``: PPRS overtakes pipelined GD as the pipeline deepens.

The instance is the depth study's (``hpcpipe.studies.depth_runs``): ``nesterov-chain`` at
x = RL/ε = 32, so d = k = ⌊x²/16⌋ = 64, on which GD must pay many iterations. GD, AGD and
PPRS start from their theory plans (``optim.methods.theory_plan``) with the step factors the
depth study's tuning chose at Δ = 2 over 1/16 … 256 (GD × 4, AGD × 1/4, PPRS × 64; K = 16),
m = 1, GPipe, t_F = t_B = τ; every run stops at its first iterate with f − f* ≤ ε.

Model clock, GPipe, one layer per stage: an iteration costs 2(K·m + Δ − 1)τ, with K = 1 for
GD and AGD (the paper's pipeline time; ``pipeline.schedules``). With I iterations to ε, the
time to ε is I·2(K + Δ − 1)τ: GD pays the depth for every gradient, PPRS once for its K
samples. GD and PPRS are equally fast at I_GD·Δ = I_PPRS·(K + Δ − 1), the crossover

    Δ* = I_PPRS·(K − 1) / (I_GD − I_PPRS)        (``studies.depth.law_crossover``).

Two predictions of Δ* are printed: from the iteration counts measured on real MPI ranks at
the smallest depth, and from the bounds' plans (T_GD = x², T_PPRS = ⌈8LR d^(1/4)/ε⌉). The
measurement is the time to ε at each depth: on real MPI ranks (one layer per rank) at
Δ = ranks, and on the simulated pipeline elsewhere, which reproduces the MPI engine's model
clock exactly (the demo runs both at Δ = ranks and says whether they agree). The measured Δ*
is where the measured GD/PPRS ratio crosses 1 (``studies.depth.crossover``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

X = 32.0  # RL/ε: the depth study's middle instance (d = 64)
FACTORS = {"gd": 4.0, "agd": 0.25, "pprs": 64.0}  # the depth study's tuned steps at x = 32
NAMES = {"gd": "GD", "agd": "AGD", "pprs": "PPRS"}
DEPTHS = (2, 8, 16, 32, 64, 256, 1024)  # simulated; the MPI depth (the ranks) is added


@dataclass
class Cell:
    """One run: the method, the depth, the executor, iterations and time to ε (nan: never)."""

    method: str
    depth: int
    executor: str
    iterations: float
    time: float
    samples: int


def settings(method: str, depth: int, executor: str, **over) -> dict:
    """The run settings of one cell (the depth study's tuned configuration at x = 32);
    ``over`` changes some (a planted fault in the tests)."""
    from hpcpipe.studies.depth_runs import DepthPlan, _settings

    plan = DepthPlan(xs=(X,), methods=(method,))
    (_, _, _, values), *_ = _settings(plan)
    values = {**values, "lr": FACTORS[method] * values["lr"], "depth": depth}
    return {
        **values,
        "executor": executor,
        "stop_at_epsilon": 1,
        "wait": "sleep",
        "output": "",
        **over,
    }


def run_cell(comm, method: str, depth: int, executor: str, **over) -> Cell:
    """Run one cell on ``comm`` (all its ranks) and return its first iterate with gap ≤ ε."""
    import numpy as np

    from hpcpipe.run.config import make_config
    from hpcpipe.run.runner import run

    values = settings(method, depth, executor, **over)
    res = run(make_config(values), comm)
    gap, clock = np.asarray(res.column("gap")), np.asarray(res.column("pipeline_time"))
    hit = np.flatnonzero(np.isfinite(gap) & (gap <= values["epsilon"]))
    it = float(res.column("iteration")[hit[0]]) if hit.size else math.nan
    t = float(clock[hit[0]]) if hit.size else math.nan
    return Cell(method, depth, executor, it, t, int(values["samples"]))


@dataclass
class Crossover:
    """What the demo found: measured and predicted Δ*, and the ratio at the deepest depth."""

    depths: list[int]
    ratio: list[float]  # GD / PPRS time to ε per depth
    measured: float
    from_counts: float
    from_bounds: float
    samples: int
    counts: tuple[float, float]  # (I_GD, I_PPRS) at the MPI depth


def crossover(cells: list[Cell], base_depth: int, plans: tuple[int, int, int]) -> Crossover:
    """Δ* measured from the times to ε (MPI where run, else simulated), and predicted from
    the iteration counts at ``base_depth`` (MPI where run) and from the bounds' plans."""
    from hpcpipe.studies.depth import crossover_of_times, law_crossover

    t = {(c.method, c.depth): c.time for c in cells if c.executor == "simulated"}
    t.update({(c.method, c.depth): c.time for c in cells if c.executor == "mpi"})
    depths = sorted({d for (m, d) in t if m == "gd" and ("pprs", d) in t})
    ratio = [t[("gd", d)] / t[("pprs", d)] for d in depths]
    at = {c.method: c for c in cells if c.executor == "simulated" and c.depth == base_depth}
    at.update({c.method: c for c in cells if c.executor == "mpi" and c.depth == base_depth})
    i_gd, i_pp, K = at["gd"].iterations, at["pprs"].iterations, at["pprs"].samples
    t_gd, t_pp, k_plan = plans
    return Crossover(
        depths,
        ratio,
        crossover_of_times(depths, *([t[(m, d)] for d in depths] for m in ("gd", "pprs"))),
        law_crossover(i_gd, i_pp, K),
        law_crossover(t_gd, t_pp, k_plan),
        K,
        (i_gd, i_pp),
    )


def _plans() -> tuple[int, int, int]:
    """(T_GD, T_PPRS, K) of the theory plans at x (the bounds' prediction)."""
    from hpcpipe.optim.methods import theory_plan
    from hpcpipe.studies.depth_runs import DepthPlan, constants

    L, R, d = constants(DepthPlan(xs=(X,)), X)
    eps = R * L / X
    gd, pp = theory_plan("gd", eps, L, R, d), theory_plan("pprs", eps, L, R, d)
    return gd.iterations, pp.iterations, pp.method.samples


def _depth(v: float) -> str:
    return "never" if not math.isfinite(v) else f"{v:.3g}"


def summary(x: Crossover) -> str:
    """The sentence that says what the run shows, from its own numbers."""
    deep, r = x.depths[-1], x.ratio[-1]
    if math.isfinite(x.measured) and r > 1:
        return (
            f"PPRS pays the pipeline's depth once per iteration for its K = {x.samples} "
            f"samples, GD once per gradient: from about {x.measured:.0f} layers on PPRS "
            f"reaches eps first, and at depth {deep} it is {r:.2f}x faster than GD."
        )
    return (
        f"PPRS did not overtake GD up to depth {deep} (GD/PPRS = {r:.2f} there): this is "
        "not the behaviour the paper predicts for this instance."
    )


def report(cells: list[Cell], x: Crossover, mpi_depth: int, ranks: int) -> str:
    """The printed tables: time to ε per method and depth, Δ* measured and predicted."""
    from hpcpipe.run.table import table

    depths = sorted({c.depth for c in cells})
    by = {(c.method, c.depth, c.executor): c for c in cells}

    def cell(m: str, d: int) -> str:
        c = by.get((m, d, "mpi")) or by.get((m, d, "simulated"))
        return "never" if not math.isfinite(c.time) else f"{c.time:.0f}"

    head = ["method", *(f"{d}*" if d == mpi_depth else str(d) for d in depths)]
    rows = [[NAMES[m], *(cell(m, d) for d in depths)] for m in NAMES]
    rows.append(["GD/PPRS", *(f"{q:.2f}" for q in x.ratio)])
    twin = [
        (by[(m, mpi_depth, "mpi")].time, by[(m, mpi_depth, "simulated")].time)
        for m in NAMES
        if (m, mpi_depth, "simulated") in by
    ]
    same = all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in twin)
    i_gd, i_pp = x.counts
    return "\n".join(
        [
            "time to eps, in tau (model clock: t_F = t_B = 1 tau per layer, GPipe, m = 1)",
            table(head, rows),
            f"* on {ranks} MPI ranks, one layer each; the other depths on the simulated "
            f"pipeline (MPI = simulated at depth {mpi_depth}: {'yes' if same else 'NO'})",
            "",
            f"crossover depth Delta*: measured {_depth(x.measured)}; predicted "
            f"{_depth(x.from_counts)} from the iteration counts on the MPI ranks (GD "
            f"{i_gd:.0f}, PPRS {i_pp:.0f} with K = {x.samples}: "
            f"Delta* = I_PPRS (K - 1) / (I_GD - I_PPRS)), {_depth(x.from_bounds)} from the "
            "bounds' plans",
            summary(x),
        ]
    )


def figure(cells: list[Cell], x: Crossover, path: Path) -> str:
    """Time to ε against depth, one line per method, the predicted Δ* marked; the path
    written, or why there is no figure."""
    from hpcpipe.optional import available, install_hint

    if not available("matplotlib"):
        return f"no figure: {install_hint('matplotlib', 'plot')}"
    from hpcpipe.studies.common import figure as pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for m, style in zip(NAMES, ("o-", "s--", "^-")):
        pts = sorted(
            (c.depth, c.time)
            for c in cells
            if c.method == m and c.executor == "simulated" and math.isfinite(c.time)
        )
        if pts:
            ax.plot(*zip(*pts), style, label=NAMES[m])
    if math.isfinite(x.from_counts):
        ax.axvline(x.from_counts, color="grey", ls=":", label=f"predicted Δ* = {x.from_counts:.3g}")
    if math.isfinite(x.measured):
        ax.axvline(
            x.measured, color="black", ls="-.", lw=0.8, label=f"measured Δ* = {x.measured:.3g}"
        )
    ax.set(xscale="log", yscale="log", xlabel="depth Δ (layers = pipeline stages)")
    ax.set(ylabel="time to ε (τ)", title=f"nesterov-chain, RL/ε = {X:g}, d = 64")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def new_path(path: Path) -> Path:
    """``path``, or ``stem-1.suffix``, ``stem-2.suffix``… when it exists (never overwrite)."""
    n, p = 0, path
    while p.exists():
        n += 1
        p = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return p


def demo(comm, figure_path: str | None = "hpcpipe-demo.png", progress: str = "auto") -> int:
    """Run the demo on ``comm``: the MPI cells on all ranks, then the simulated cells spread
    over the ranks; rank 0 prints the tables and draws the figure, and shows the progress of
    its share of the simulated cells (``Waiting``, mode ``progress``)."""
    from mpi4py import MPI

    from hpcpipe.run.progress import Waiting

    t0 = time.perf_counter()
    rank, size = comm.rank, comm.size
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"hpcpipe demo: GD, AGD and PPRS to eps on nesterov-chain (the depth study's instance, "
        f"RL/eps = {X:g}, d = 64) at depths {size} (MPI ranks) and {', '.join(map(str, DEPTHS))} "
        "(simulated)",
        flush=True,
    )
    cells = []
    for m in NAMES:
        cells.append(run_cell(comm, m, size, "mpi"))
        say(f"  {NAMES[m]} on {size} MPI ranks: {time.perf_counter() - t0:.1f} s", flush=True)
    todo = [(m, d) for d in sorted({*DEPTHS, size}) for m in NAMES]
    share = [md for i, md in enumerate(todo) if i % size == rank]
    shown = Waiting("  simulated runs (rank 0's share)", len(share), progress, rank == 0)
    mine = []
    for m, d in share:
        mine.append(run_cell(MPI.COMM_SELF, m, d, "simulated"))
        shown.update(len(mine))
    shown.close()
    for part in comm.gather(mine, root=0) or []:
        cells += part
    if rank != 0:
        return 0
    say(f"  {len(todo)} simulated runs: {time.perf_counter() - t0:.1f} s", flush=True)
    x = crossover(cells, size, _plans())
    say(report(cells, x, size, size))
    if figure_path:
        say(figure(cells, x, new_path(Path(figure_path))))
    say(f"(total {time.perf_counter() - t0:.1f} s; the digits attack demo: hpcpipe demo attack)")
    return 0
