"""Pictures of a timeline: Chrome trace events (Perfetto) and a Gantt PNG.

Chrome trace event format (JSON, timestamps in microseconds):

* one process per rank, with one track per stage named ``rank r · stage s``;
  a complete event (``"ph": "X"``) per action (``F3``: forward of item 3) and
  per receive wait before it;
* a process ``optimizer`` with a track of iteration slices (one per recorded
  oracle call) and instant events (``"ph": "i"``) for the optimizer steps and
  for the HDF5 flushes;
* a flow arrow (``"ph": "s"`` at the sender's action, ``"ph": "f"`` at the
  receiver's) for each message between neighbouring stages: an activation
  forward, a gradient backward.

Iterations are laid end to end on the run's clock. On the model clock each
oracle call's times start at 0, so iteration t is shifted by the cumulative
pipeline time of the iterations before it (the ``pipeline_time`` column),
and one τ is drawn as one µs. On the wall clock the recorded seconds are
already on one time line (from the engine's start) and are drawn as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hpcpipe.optional import need
from hpcpipe.pipeline.schedules import Kind, consumer
from hpcpipe.run import atomic

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")
COLORS = {k.letter: PALETTE[k % len(PALETTE)] for k in Kind}
MESSAGES = {Kind.FORWARD: "activation", Kind.BACKWARD: "gradient", Kind.INPUT: "gradient"}
# the kinds that may wait for a message of each sending kind (a gradient feeds a B or an I)
RECEIVERS = {Kind.FORWARD: ("F",), Kind.BACKWARD: ("B", "I"), Kind.INPUT: ("B", "I")}


def time_unit(clock: str) -> tuple[float, str]:
    """(microseconds per recorded unit, what one trace microsecond means)."""
    if clock == "model":
        return 1.0, "1 us = 1 tau (model time unit)"
    return 1e6, "1 us = 1 us of wall-clock time"


def iteration_offsets(
    timeline: dict[str, np.ndarray], clock: str, iterations: dict[str, np.ndarray] | None
) -> dict[int, float]:
    """Start of each recorded iteration on one time line (in the timeline's units).

    Model clock: the cumulative pipeline time before the iteration, from the
    per-iteration table when it has the row, else right after the previous
    recorded iteration. Wall clock: 0 (times already share one origin), unless
    an iteration would start before the previous one ended (a resumed run's new
    engine starts its clock again), which then follows it.
    """
    its = np.unique(timeline["iteration"]).astype(int)
    before = {}
    if clock == "model" and iterations is not None and len(iterations.get("iteration", [])):
        cum = np.asarray(iterations["pipeline_time"], float)
        rows = np.asarray(iterations["iteration"]).astype(int)
        prev = np.concatenate([[0.0], cum[:-1]])
        before = dict(zip(rows.tolist(), prev.tolist()))
    out, end_prev = {}, -np.inf
    for it in its.tolist():
        m = timeline["iteration"] == it
        lo, hi = float(timeline["wait"][m].min()), float(timeline["end"][m].max())
        if clock == "model":
            off = before.get(it, max(end_prev, 0.0))
        else:
            off = 0.0
        if lo + off < end_prev:  # never on top of the previous iteration
            off = end_prev - lo
        out[it] = off
        end_prev = hi + off
    return out


def chrome_trace(
    timeline: dict[str, np.ndarray],
    clock: str = "wall",
    iterations: list[int] | None = None,
    table: dict[str, np.ndarray] | None = None,
    flush_every: int = 0,
) -> dict:
    """Trace-event JSON object of the recorded actions, waits, messages, steps and flushes.

    ``table``: the result's per-iteration columns (for the model clock's
    cumulative time); ``flush_every``: the run's flush period (instant events).
    """
    sel = np.ones(len(timeline["end"]), dtype=bool)
    if iterations is not None:
        sel = np.isin(timeline["iteration"], iterations)
    tl = {k: np.asarray(v)[sel] for k, v in timeline.items()}
    scale, unit = time_unit(clock)
    offsets = iteration_offsets(tl, clock, table) if len(tl["end"]) else {}
    ranks = sorted(set(tl["rank"].tolist()))
    run_pid = (max(ranks) + 1) if ranks else 0
    events: list[dict] = []

    def meta(name: str, pid: int, tid: int, value) -> None:
        events.append({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": value})

    for r in ranks:
        stages = sorted(set(tl["stage"][tl["rank"] == r].tolist()))
        meta("process_name", r, 0, {"name": f"rank {r}"})
        meta("process_sort_index", r, 0, {"sort_index": r})
        for s in stages:
            meta("thread_name", r, s, {"name": f"rank {r} · stage {s}"})
    meta("process_name", run_pid, 0, {"name": f"optimizer ({unit})"})
    meta("process_sort_index", run_pid, 0, {"sort_index": -1})
    meta("thread_name", run_pid, 0, {"name": "iterations"})
    meta("thread_name", run_pid, 1, {"name": "optimizer steps and flushes"})

    shifted = {}  # (iteration, stage, kind, item) -> (pid, tid, ts) of the compute slice
    for idx in range(len(tl["end"])):
        r, s = int(tl["rank"][idx]), int(tl["stage"][idx])
        kind = Kind(int(tl["kind"][idx])).letter
        item, it = int(tl["item"][idx]), int(tl["iteration"][idx])
        off = offsets[it]
        w, st, en = ((float(tl[k][idx]) + off) * scale for k in ("wait", "start", "end"))
        args = {"iteration": it, "item": item, "stage": s, "clock": clock}
        if st > w:
            events.append(
                {
                    "name": f"wait {kind}{item}",
                    "cat": "wait",
                    "ph": "X",
                    "pid": r,
                    "tid": s,
                    "ts": w,
                    "dur": st - w,
                    "args": args,
                }
            )
        events.append(
            {
                "name": f"{kind}{item}",
                "cat": kind,
                "ph": "X",
                "pid": r,
                "tid": s,
                "ts": st,
                "dur": en - st,
                "args": args,
            }
        )
        shifted[(it, s, kind, item)] = (r, s, st)
    events += _flows(shifted, int(tl["stage"].max()) + 1 if len(tl["stage"]) else 0)
    events += _optimizer_events(tl, offsets, scale, run_pid, flush_every)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"clock": clock, "time_unit": unit, "generator": "hpcpipe"},
    }


def _flows(slices: dict, n_stages: int) -> list[dict]:
    """One arrow per message, to the action that waits for it (``schedules.consumer``):
    F(s, i) -> F(s + 1, i), an activation; B or I (s, i) -> B or I (s - 1, i), a
    gradient. A hand-off between two stages of one rank is a local copy, not a
    message: it gets no arrow. W sends nothing."""
    out, fid = [], 0
    for (it, s, kind, item), (pid, tid, ts) in slices.items():
        k = Kind.parse(kind)
        to_stage = consumer(s, k, n_stages)
        if to_stage is None:
            continue
        to = next(
            (t for t in ((it, to_stage, kr, item) for kr in RECEIVERS[k]) if t in slices), None
        )
        if to is None:
            continue
        pid2, tid2, ts2 = slices[to]
        if pid2 == pid:
            continue
        fid += 1
        name = MESSAGES.get(k, k.name.lower())
        common = {"name": name, "cat": kind, "id": fid}
        out.append({**common, "ph": "s", "pid": pid, "tid": tid, "ts": ts})
        out.append({**common, "ph": "f", "bp": "e", "pid": pid2, "tid": tid2, "ts": ts2})
    return out


def _optimizer_events(tl, offsets, scale, pid, flush_every) -> list[dict]:
    """Iteration slices, then an optimizer step (and a flush when due) at each one's end."""
    out = []
    for it, off in offsets.items():
        m = tl["iteration"] == it
        lo = (float(tl["wait"][m].min()) + off) * scale
        hi = (float(tl["end"][m].max()) + off) * scale
        args = {"iteration": it}
        out.append(
            {
                "name": f"iteration {it}",
                "cat": "iteration",
                "ph": "X",
                "pid": pid,
                "tid": 0,
                "ts": lo,
                "dur": hi - lo,
                "args": args,
            }
        )
        step = {"cat": "optimizer", "ph": "i", "s": "t", "pid": pid, "tid": 1, "ts": hi}
        out.append({**step, "name": f"step {it}", "args": args})
        if flush_every and it % flush_every == 0:
            out.append({**step, "name": f"flush (iterations <= {it} on disk)", "args": args})
    return out


def write_trace(
    timeline, path: str | Path, clock: str = "wall", iterations=None, table=None, flush_every=0
) -> int:
    obj = chrome_trace(timeline, clock, iterations, table, flush_every)
    atomic.write_text(path, json.dumps(obj))  # whole or not at all
    return len(obj["traceEvents"])


def gantt_figure(
    rows: list[list[tuple[float, float, str, int]]],
    title: str = "",
    unit: str = "s",
):
    """Per-stage cells (start, end, kind, item) as a matplotlib Figure.

    The size grows with the stages and the cells per stage; an item label is
    drawn only where it fits inside its cell; the legend names F and B and the
    title gives the bubble fraction 1 − Σ busy / (S · makespan).
    """
    need("matplotlib", "plot", "a Gantt chart").use("Agg")
    plt = need("matplotlib.pyplot", "plot", "a Gantt chart")
    Patch = need("matplotlib.patches", "plot", "a Gantt chart").Patch
    S = len(rows)
    cells = [c for r in rows for c in r]
    t0 = min((c[0] for c in cells), default=0.0)
    t1 = max((c[1] for c in cells), default=1.0)
    span = (t1 - t0) or 1.0
    busy = sum(c[1] - c[0] for c in cells)
    bubble = 1.0 - busy / (S * span) if S else 0.0
    per_stage = max((len(r) for r in rows), default=1)
    width = float(np.clip(5.0 + 0.09 * per_stage, 7.0, 16.0))
    height = float(np.clip(1.5 + 0.42 * S, 2.6, 12.0))
    fig, ax = plt.subplots(figsize=(width, height))
    dpi, fontsize = fig.dpi, 7.0
    axes_px = 0.85 * width * dpi
    for s, row in enumerate(rows):
        for start, end, kind, item in row:
            ax.barh(
                S - 1 - s,
                end - start,
                left=start,
                height=0.8,
                color=COLORS[kind],
                edgecolor="white",
                linewidth=0.3,
            )
            label = f"{kind}{item}"
            need_px = (len(label) * 0.62 + 0.6) * fontsize * dpi / 72.0
            if (end - start) / span * axes_px >= need_px:
                ax.text(
                    (start + end) / 2,
                    S - 1 - s,
                    label,
                    ha="center",
                    va="center",
                    fontsize=fontsize,
                    color="white",
                )
    ax.set_xlim(t0, t0 + span * 1.01)
    ax.set_yticks(range(S))
    ax.set_yticklabels([f"stage {S - 1 - s}" for s in range(S)])
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(f"{title}\nbubble fraction {bubble:.3f}" if title else f"bubble {bubble:.3f}")
    drawn = {cell[2] for row in rows for cell in row}  # the kinds present, in Kind order
    ax.legend(
        handles=[
            Patch(color=COLORS[k.letter], label=f"{k.letter}: {k.name.lower()}")
            for k in Kind
            if k.letter in drawn
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    return fig


def gantt_png(rows, path: str | Path, title: str = "", unit: str = "s") -> None:
    """Draw :func:`gantt_figure` to a PNG file."""
    plt = need("matplotlib.pyplot", "plot", "a Gantt chart")
    fig = gantt_figure(rows, title, unit)
    try:
        atomic.write(path, lambda tmp: fig.savefig(tmp, dpi=120))  # whole or not at all
    finally:
        plt.close(fig)


def timeline_rows(timeline: dict[str, np.ndarray], iteration: int):
    """Gantt cells of one recorded iteration of a result's timeline, per stage."""
    sel = timeline["iteration"] == iteration
    if not sel.any():
        raise ValueError(f"iteration {iteration} was not recorded in the timeline")
    stages = sorted(set(timeline["stage"][sel].tolist()))
    t0 = float(timeline["start"][sel].min())
    rows = []
    for s in stages:
        m = sel & (timeline["stage"] == s)
        rows.append(
            [
                (float(a) - t0, float(b) - t0, Kind(int(k)).letter, int(i))
                for a, b, k, i in zip(
                    timeline["start"][m],
                    timeline["end"][m],
                    timeline["kind"][m],
                    timeline["item"][m],
                )
            ]
        )
    return rows
