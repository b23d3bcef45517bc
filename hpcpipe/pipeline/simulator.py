"""Discrete-event simulator: times any schedule under a cost model, without MPI.

It runs the same ``Schedule`` objects as the engine, through the same
dependency walk as the validator (``schedules.walk``), with the model clock's
rules (``clocks``): an action on stage s starts at max(stage clock, end of
the action it depends on + α + bytes·β) and lasts t_F[s] or t_B[s]. It
therefore equals the model clock of a real MPI run of the same configuration
exactly (tested), and scales to any S and n.

Closed forms for uniform costs (t_F, t_B per stage, message cost c = α + b·β
for every message) are kept with each schedule in the registry
(``schedules.SCHEDULES``) with how each was obtained, and checked against the
simulator and the MPI model clock by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcpipe.model.stages import partition
from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.clocks import CostModel


@dataclass
class SimResult:
    """Timing of one schedule: makespan and per-stage busy/idle time."""

    schedule: schedules.Schedule
    makespan: float
    stage_end: list[float]
    busy: list[float]
    ends: list[list[float]]
    waits: list[list[float]] | None = None
    readys: list[list[float]] | None = None

    @property
    def bubble_fraction(self) -> float:
        """Share of stage-time idle: 1 − Σ_s busy_s / (S · makespan)."""
        S = self.schedule.n_stages
        return 1.0 - sum(self.busy) / (S * self.makespan) if self.makespan > 0 else 0.0


def stage_times(costs: CostModel, depth: int, n_stages: int) -> tuple[list[float], list[float]]:
    """Per-stage (t_F, t_B): each stage's blocks' costs summed, as the engine does."""
    tf, tb = [], []
    for lo, hi in partition(depth, n_stages):
        f, b = costs.stage_costs(lo, hi)
        tf.append(f)
        tb.append(b)
    return tf, tb


def message_costs(
    costs: CostModel, boundary_widths: list[int], item_rows: list[int], itemsize: int = 8
) -> list[list[float]]:
    """c[s][i] = α + bytes·β for item i across boundary s (stage s to s+1).

    bytes = rows_i · width_s · itemsize: the payload the engine sends (the
    trailing clock stamp is not counted).
    """
    return [[costs.message(r * w * itemsize) for r in item_rows] for w in boundary_widths]


def simulate(
    schedule: schedules.Schedule,
    t_forward: list[float],
    t_backward: list[float],
    message: list[list[float]] | None = None,
    record: bool = False,
) -> SimResult:
    """Time ``schedule`` with per-stage costs and per-(boundary, item) message costs."""
    out = schedules.walk(schedule, t_forward, t_backward, message, record)
    clock, ends = out[0], out[1]
    n = schedule.n_items
    busy = [n * (t_forward[s] + t_backward[s]) for s in range(schedule.n_stages)]
    res = SimResult(schedule, max(clock), list(clock), busy, ends)
    if record:
        res.waits, res.readys = out[2], out[3]
    return res


def simulate_uniform(
    name: str,
    n_stages: int,
    n_items: int,
    t_f: float,
    t_b: float,
    c: float = 0.0,
    record: bool = False,
) -> SimResult:
    """Simulate a named schedule with the same costs on every stage and message."""
    sch = schedules.build(name, n_stages, n_items)
    msg = [[c] * n_items for _ in range(n_stages - 1)]
    return simulate(sch, [t_f] * n_stages, [t_b] * n_stages, msg, record)


def closed_form(name: str, S: int, n: int, t_f: float, t_b: float, c: float = 0.0) -> float:
    """Makespan of a registered schedule with uniform costs, from its registry entry.

    The formulas and how each was obtained are in the builders' companions in
    ``schedules`` (``sequential_time``, ``gpipe_time``, ``one_f_one_b_time``:
    the last one's message term is empirical). Raises ValueError when the
    schedule has no closed form.
    """
    cf = schedules.entry(name).closed_form
    if cf is None:
        raise ValueError(f"no closed form for schedule {name!r}")
    return cf(S, n, t_f, t_b, c)


def pipeline_speedup(K: int, depth: int) -> float:
    """Speed-up of pipelining K items over depth Δ against the sequential schedule.

    Sequential pays K·Δ slots, GPipe K + Δ − 1: ratio K·Δ/(K + Δ − 1).
    """
    return K * depth / (K + depth - 1)


def gantt_rows(res: SimResult) -> list[list[tuple[float, float, str, int]]]:
    """Per stage, (start, end, kind, item) cells for a timeline picture."""
    if res.readys is None:
        raise ValueError("simulate(..., record=True) is needed for a timeline")
    rows = []
    for s, codes in enumerate(res.schedule.codes):
        its, kds = schedules.decode_list(codes)
        rows.append(
            [
                (res.readys[s][p], res.ends[s][p], schedules.Kind(k).letter, i)
                for p, (i, k) in enumerate(zip(its, kds))
            ]
        )
    return rows


def throughput(n_stages: int = 1024, n_items: int = 1024, name: str = "gpipe") -> tuple[int, float]:
    """(actions, seconds) to simulate a schedule: the simulator's own speed."""
    import time

    sch = schedules.build(name, n_stages, n_items)
    t0 = time.perf_counter()
    simulate(sch, [1.0] * n_stages, [2.0] * n_stages, [[0.1] * n_items] * (n_stages - 1))
    return len(sch), time.perf_counter() - t0


__all__ = [
    "SimResult",
    "closed_form",
    "message_costs",
    "simulate",
    "simulate_uniform",
    "stage_times",
    "pipeline_speedup",
]
