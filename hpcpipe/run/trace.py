"""Pictures of a timeline: Chrome trace events (Perfetto) and a Gantt PNG.

Chrome trace event format: complete events ``{"ph": "X", "ts", "dur"}`` in
microseconds, one process per rank and one thread per stage, named with
metadata events, so chrome://tracing and ui.perfetto.dev show one row per
stage.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hpcpipe.pipeline.schedules import Kind


def chrome_trace(
    timeline: dict[str, np.ndarray], clock: str = "wall", iterations: list[int] | None = None
) -> dict:
    """Trace-event JSON object of the recorded actions (and their receive waits)."""
    sel = np.ones(len(timeline["end"]), dtype=bool)
    if iterations is not None:
        sel = np.isin(timeline["iteration"], iterations)
    scale = 1e6  # seconds (or model units) -> microseconds
    events = []
    ranks = sorted(set(timeline["rank"][sel].tolist()))
    for r in ranks:
        events.append(
            {"name": "process_name", "ph": "M", "pid": r, "tid": r, "args": {"name": f"rank {r}"}}
        )
        events.append(
            {"name": "thread_name", "ph": "M", "pid": r, "tid": r, "args": {"name": f"stage {r}"}}
        )
    for idx in np.flatnonzero(sel):
        r = int(timeline["rank"][idx])
        s = int(timeline["stage"][idx])
        kind = Kind(int(timeline["kind"][idx])).letter
        item, it = int(timeline["item"][idx]), int(timeline["iteration"][idx])
        w, st, en = (float(timeline[k][idx]) for k in ("wait", "start", "end"))
        args = {"iteration": it, "item": item, "clock": clock}
        if st > w:
            events.append(
                {
                    "name": f"wait {kind}{item}",
                    "cat": "wait",
                    "ph": "X",
                    "pid": r,
                    "tid": s,
                    "ts": w * scale,
                    "dur": (st - w) * scale,
                    "args": args,
                }
            )
        events.append(
            {
                "name": f"{s}{kind}{item}",
                "cat": kind,
                "ph": "X",
                "pid": r,
                "tid": s,
                "ts": st * scale,
                "dur": (en - st) * scale,
                "args": args,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"clock": clock, "generator": "hpcpipe"},
    }


def write_trace(timeline, path: str | Path, clock: str = "wall", iterations=None) -> int:
    obj = chrome_trace(timeline, clock, iterations)
    Path(path).write_text(json.dumps(obj))
    return len(obj["traceEvents"])


def gantt_png(
    rows: list[list[tuple[float, float, str, int]]],
    path: str | Path,
    title: str = "",
    unit: str = "s",
) -> None:
    """Draw per-stage cells (start, end, kind, item): one colour per action kind."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover
        raise RuntimeError("plots need matplotlib: pip install 'hpcpipe[plot]'") from e
    S = len(rows)
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * S))
    palette = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")
    colors = {k.letter: palette[k % len(palette)] for k in Kind}
    many = sum(len(r) for r in rows) > 400
    for s, cells in enumerate(rows):
        for start, end, kind, item in cells:
            ax.barh(
                S - 1 - s,
                end - start,
                left=start,
                height=0.8,
                color=colors[kind],
                edgecolor="white",
                linewidth=0.3,
            )
            if not many:
                ax.text(
                    (start + end) / 2,
                    S - 1 - s,
                    f"{kind}{item}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white",
                )
    ax.set_yticks(range(S))
    ax.set_yticklabels([f"stage {S - 1 - s}" for s in range(S)])
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
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
