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
    """Each stage's list, the per-rank grid (step × rank), then the makespan, the bubble
    fraction and the peak stashed activations per rank, under uniform per-stage costs.

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
        schedules.render(schedule, max_steps),  # each stage's own list
        f"{schedule.n_ranks} ranks; placement (stage -> rank) {list(schedule.placement)}; "
        "per-rank grid:",
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


def _fail(message: str) -> int:
    import sys

    print(f"hpcpipe schedule: {message}", file=sys.stderr)
    return 2


def schedule_command(args) -> int:
    """``hpcpipe schedule``: build (or read from torch's CSV) a schedule, check it and
    print ``summary``; with ``--write-csv`` also write torch's CSV. Bad input: one
    line on stderr and exit 2; a deadlock: the cycle and the marked grid, exit 2."""
    import sys
    from pathlib import Path

    from hpcpipe.pipeline import torch_csv

    for field in ("ranks", "items", "virtual"):
        value = getattr(args, field, None)
        if value is not None and value < 1:
            return _fail(f"--{field} must be >= 1, got {value}")
    for field in ("t_forward", "t_backward", "t_input", "t_weight", "message", "item_bytes"):
        value = getattr(args, field, None)
        if value is not None and not (value >= 0 and np.isfinite(value)):
            return _fail(f"--{field.replace('_', '-')} must be a finite number >= 0, got {value}")
    if (args.t_input is None) != (args.t_weight is None):
        return _fail("--t-input and --t-weight go together (t_B = t_I + t_W): give both or none")
    from hpcpipe.run.config import path_error

    for flag, path, write in (
        ("--write-csv", args.write_csv, True),
        ("--from-csv", args.from_csv, False),
    ):
        err = path_error(flag, path, write=write) if path else None
        if err:
            return _fail(err)
    out = args.write_csv
    if out:
        p = Path(out)
        if p.exists():
            return _fail(f"--write-csv {out} exists: choose another path (it is never overwritten)")
        if not p.parent.is_dir():
            return _fail(f"--write-csv {out}: folder {str(p.parent)!r} does not exist")
    if args.from_csv:
        if not Path(args.from_csv).is_file():
            return _fail(f"--from-csv {args.from_csv}: no such file")
        try:
            sch = torch_csv.read_csv(args.from_csv)
        except (schedules.ScheduleError, OSError, UnicodeDecodeError) as e:
            return _fail(f"--from-csv {args.from_csv}: {e}")
    elif not args.kind:
        return _fail("name a schedule (e.g. zb-h1) or give --from-csv FILE")
    else:
        options = {} if args.virtual is None else {"virtual": args.virtual}
        try:
            sch = schedules.build(args.kind, args.ranks, args.items, **options)
        except TypeError:
            return _fail(f"--virtual: schedule {args.kind!r} has one stage per rank")
        except schedules.ScheduleError as e:
            return _fail(str(e).splitlines()[0])
    try:
        sch.validate()
    except schedules.ScheduleError as e:
        print(f"hpcpipe schedule: refused: {e}", file=sys.stderr)
        return 2
    tb = args.t_backward
    if args.t_input is not None:
        tb = args.t_input + args.t_weight
    print(
        summary(
            sch,
            args.t_forward,
            tb,
            args.t_input,
            args.t_weight,
            args.message,
            args.item_bytes,
            args.max_steps,
        )
    )
    if out:
        torch_csv.write_csv(sch, out)
        print(f"wrote {out} (torch.distributed.pipelining CSV, compute-only)")
    return 0
