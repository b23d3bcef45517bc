"""Any sweep's points: the table and figures ``hpcpipe analyze`` gives a user's own grid.

The built-in studies read the runs tagged with their name. Every other result file in a
results folder is a point of the user's own sweep: this section lists each point with the
settings that vary across the folder (its grid values), its status, iterations, time to ε
(when ε > 0 and f* is known), final gap and pipeline time, and draws the loss against the
pipeline time, one figure per grid key with one colour per value of that key. A table, not
a verdict: nothing here is a claim.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from hpcpipe.studies.common import (
    Record,
    StudyResult,
    figure,
    legend_outside,
    save_figure,
    series_style,
)

NAME = "points"
# settings that name a file or a label, not a point of the grid
NOT_GRID = ("output", "tag", "progress", "timeout", "flush_every", "wait")


def grid_keys(recs: list[Record]) -> list[str]:
    """Settings whose value differs between the points (in the settings' order)."""
    keys = list(dict.fromkeys(k for r in recs for k in r.config))
    return [k for k in keys if k not in NOT_GRID and len({repr(r.config.get(k)) for r in recs}) > 1]


def _last_finite(v) -> float:
    a = np.asarray(v, float)
    a = a[np.isfinite(a)]
    return float(a[-1]) if a.size else math.nan


def _row(r: Record, keys: list[str]) -> list:
    eps = float(r.config.get("epsilon", 0) or 0)
    it_eps, t_eps = r.first_reach(eps) if eps > 0 else (math.nan, math.nan)
    n = len(r.it["iteration"])
    return [
        r.file,
        *(r.config.get(k, "") for k in keys),
        r.status,
        int(r.it["iteration"][-1]) if n else 0,
        "-" if eps <= 0 else ("never" if math.isnan(it_eps) else int(it_eps)),
        "-" if eps <= 0 else ("never" if math.isnan(t_eps) else t_eps),
        _last_finite(r.it["gap"]) if n else math.nan,
        _last_finite(r.it["loss"]) if n else math.nan,
        float(r.it["pipeline_time"][-1]) if n else math.nan,
    ]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "results"


def study(recs: list[Record], outdir: Path, source: str) -> StudyResult:
    """The points of one results folder (``source``) as a table and loss figures."""
    res = StudyResult(f"{NAME}: {source}")
    recs = sorted(recs, key=lambda r: r.file)
    keys = grid_keys(recs)
    head = [
        "file",
        *keys,
        "status",
        "iterations",
        "iterations to eps",
        "time to eps",
        "final f - f*",
        "final loss",
        "pipeline time",
    ]
    res.tables.append((f"{len(recs)} points", head, [_row(r, keys) for r in recs]))
    clocks = sorted({str(r.config.get("clock", "model")) for r in recs})
    res.notes.append(
        f"grid keys (settings that differ between the points): {', '.join(keys) or 'none'}; "
        f"pipeline time on the {' and '.join(clocks)} clock "
        "(model: tau units, or seconds with a machine profile; wall: seconds)"
    )
    for key in keys or [None]:
        _loss_figure(recs, key, outdir, f"points-{_slug(source)}-{key or 'all'}.png", res)
    return res


def _loss_figure(recs, key, outdir: Path, name: str, res: StudyResult) -> None:
    plt = figure()
    fig, ax = plt.subplots(figsize=(7.6, 4.2))
    values = list(dict.fromkeys(repr(r.config.get(key)) for r in recs)) if key else ["all"]
    labelled = set()
    for r in recs:
        if not len(r.it["iteration"]):
            continue
        v = repr(r.config.get(key)) if key else "all"
        style = series_style(values.index(v))
        label = f"{key} = {r.config.get(key)}" if key and v not in labelled else None
        labelled.add(v)
        loss = np.asarray(r.it["loss"], float)
        ax.plot(r.it["pipeline_time"], loss, lw=1, color=style["color"], label=label)
    ax.set(xlabel="pipeline time", ylabel="loss", title=f"loss by {key or 'point'}")
    if np.all(np.asarray([_last_finite(r.it["loss"]) for r in recs]) > 0):
        ax.set_yscale("log")
    if key:
        legend_outside(ax)
    save_figure(fig, outdir, name, res)
