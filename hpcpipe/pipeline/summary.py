"""What ``hpcpipe schedule`` prints: the action grid, makespan, bubble and memory per rank."""

from __future__ import annotations

import numpy as np

from hpcpipe.pipeline import schedules, simulator


def summary(
    schedule: schedules.Schedule,
    t_forward: float = 1.0,
    t_backward: float = 2.0,
    t_input: float | None = None,
    t_weight: float | None = None,
    message: float = 0.0,
    item_bytes: float | None = None,
    max_steps: int | None = None,
) -> str:
    """The per-rank grid (step × rank), then the makespan, the bubble fraction and the
    peak stashed activations per rank, under uniform per-stage costs.

    The makespan is the simulator's (model clock); with the closed form of a
    registered schedule beside it when its regime holds. ``item_bytes`` is the
    bytes one item stashes on one stage (the same on every stage).
    """
    S = schedule.n_stages
    tf, tb = [float(t_forward)] * S, [float(t_backward)] * S
    ti = tw = None
    if t_input is not None and t_weight is not None:
        ti, tw = [float(t_input)] * S, [float(t_weight)] * S
    msg = np.full((max(S - 1, 0), 1), float(message))
    res = simulator.simulate(schedule, tf, tb, msg, t_input=ti, t_weight=tw)
    peak = schedules.peak_stash(schedule)
    lines = [
        f"{schedule.name}: {schedule.n_ranks} ranks, {S} stages, {schedule.n_items} items, "
        f"{len(schedule)} actions; placement (stage -> rank) {list(schedule.placement)}",
        schedules.grid(schedule, max_steps=max_steps),
        f"costs per stage: t_F = {t_forward:g}, t_B = {t_backward:g}"
        + (f" (t_I = {t_input:g}, t_W = {t_weight:g})" if ti is not None else "")
        + f", message c = {message:g} (0 between stages of one rank)",
        f"makespan: {res.makespan:.12g}"
        + _closed_form_text(schedule, t_forward, t_backward, t_input, t_weight, message),
        f"bubble fraction: {res.bubble_fraction:.4f}",
        "peak stashed activations per rank (items): " + " ".join(map(str, peak)),
    ]
    if item_bytes is not None:
        per = schedules.peak_stash(schedule, [float(item_bytes)] * S)
        lines.append("peak stashed bytes per rank: " + " ".join(f"{b:.0f}" for b in per))
    return "\n".join(lines)


def _closed_form_text(schedule, tf, tb, ti, tw, c) -> str:
    name = schedule.name
    if name not in schedules.SCHEDULES:
        return ""
    cf = schedules.entry(name).closed_form
    if cf is None:
        return ""
    kw = {}
    if ti is not None and tw is not None:
        kw = {"t_i": ti, "t_w": tw}
    if schedule.n_stages != schedule.n_ranks and name in ("interleaved-1f1b", "looped-bfs"):
        kw["virtual"] = schedule.n_stages // schedule.n_ranks
    try:
        value = cf(schedule.n_ranks, schedule.n_items, tf, tb, c, **kw)
    except (schedules.OutsideRegime, TypeError):
        return " (closed form: outside its regime)"
    return f" (closed form {value:.12g})"
