"""``hpcpipe simulate``: time a schedule by discrete-event simulation, without MPI."""

from __future__ import annotations

import argparse
import sys

from hpcpipe.cli.arguments import add_schedule_arguments
from hpcpipe.cli.files import output_error

NAME = "simulate"
HELP = "time a schedule without MPI (discrete events)"
DESCRIPTION = (
    "Time a schedule by discrete-event simulation (no MPI): makespan, "
    "bubble fraction and the closed form, in model units (tau)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser, "schedule")
    parser.add_argument(
        "--t-forward", type=float, default=1.0, help="cost of a forward action (default 1)"
    )
    parser.add_argument(
        "--t-backward", type=float, default=1.0, help="cost of a backward action (default 1)"
    )
    parser.add_argument(
        "--message", type=float, default=0.0, help="cost of every message (default 0)"
    )
    parser.add_argument("--plot", metavar="PNG", help="draw the Gantt chart to this file")
    parser.add_argument(
        "--force", action="store_true", help="replace an existing HDF5 file at --plot"
    )


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.pipeline import schedules
    from hpcpipe.pipeline.simulator import closed_form, gantt_rows, simulate_uniform

    err = output_error(args.plot, (), args.force) if args.plot else None
    if err:  # before any work
        print(f"hpcpipe: {err.replace('-o ', '--plot ')}", file=sys.stderr)
        return 2
    res = simulate_uniform(
        args.schedule,
        args.stages,
        args.items,
        args.t_forward,
        args.t_backward,
        args.message,
        record=bool(args.plot),
    )
    print(
        f"schedule {args.schedule}: S = {args.stages} stages, n = {args.items} items, "
        f"{len(res.schedule)} actions; t_F = {args.t_forward}, t_B = {args.t_backward}, "
        f"message cost c = {args.message}"
    )
    print(
        f"makespan {res.makespan:.6g}; bubble fraction {res.bubble_fraction:.4f}; "
        f"max in flight {max(schedules.max_in_flight(res.schedule))}"
    )
    try:
        cf = closed_form(
            args.schedule, args.stages, args.items, args.t_forward, args.t_backward, args.message
        )
        note = schedules.entry(args.schedule).closed_form_note
        print(f"closed form {cf:.6g} (difference {res.makespan - cf:.3g}; {note})")
    except ValueError as e:
        print(f"closed form: {e}")
    if args.plot:
        from hpcpipe.run.trace import gantt_png

        gantt_png(
            gantt_rows(res),
            args.plot,
            f"{args.schedule}, S={args.stages}, n={args.items} (simulated)",
            "τ, model time unit",
        )
        print(f"wrote {args.plot}")
    return 0
