"""Discrete-event simulator: times any schedule under a cost model, without MPI.

It runs the same ``Schedule`` objects as the engine, through the same
dependency walk as the validator (``schedules.walk``), with the model clock's
rules (``clocks``): an action on stage s starts at max(stage clock, end of
the action it depends on + α + bytes·β) and lasts t_F[s] or t_B[s]. It
therefore equals the model clock of a real MPI run of the same configuration
exactly (tested), and scales to any S and n.

Closed forms for uniform costs (t_F, t_B per stage, message cost c = α + b·β
for every message), given in ``closed_form``'s docstring with how each was
obtained, and checked against the simulator and the MPI model clock by the
tests.
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
    """Makespan of a schedule with uniform costs, exactly.

    * sequential: each item crosses S stages and S − 1 links each way before
      the next starts: T = n · (S(t_F + t_B) + 2(S − 1)c).
    * gpipe: by induction on the recurrence E_F(s,i) = max(E_F(s,i−1),
      E_F(s−1,i) + c) + t_F, the forward of item i ends on stage s at
      (s + i + 1)t_F + s·c (both arguments of the max are equal); the
      backward mirrors it from the last stage, starting at E_F(S−1, n−1).
      Hence T = (n + S − 1)(t_F + t_B) + 2(S − 1)c.
    * 1f1b: T = (n + S − 1)(t_F + t_B) + 2c·[(S − 1) + (n − 2) − ⌊(n − 2)/S⌋].
      With c = 0 this is the GPipe bubble. The message term was read off the
      exact simulator (its coefficient of c does not depend on t_F, t_B or
      c) and then checked on 1,088 random configurations (S <= 8, n <= 64,
      t_F, t_B in [0.01, 5], c in [0, 10]; worst relative error 5e-15) and
      by the tests; it is verified, not proven. Reading: the fill/drain
      pays 2(S − 1)c as in GPipe, and in steady state stage 0 keeps S items
      in flight, each a round trip of 2(S − 1) messages, i.e. 2c(1 − 1/S)
      per item — every item but one in S adds 2c.
    """
    if name == "sequential":
        return n * (S * (t_f + t_b) + 2 * (S - 1) * c)
    if name == "gpipe":
        return (n + S - 1) * (t_f + t_b) + 2 * (S - 1) * c
    if name == "1f1b":
        return (n + S - 1) * (t_f + t_b) + 2 * c * ((S - 1) + (n - 2) - (n - 2) // S)
    raise ValueError(f"no closed form for schedule {name!r}")


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
        rows.append(
            [
                (res.readys[s][p], res.ends[s][p], "B" if c & 1 else "F", int(c >> 1))
                for p, c in enumerate(codes.tolist())
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
