"""``hpcpipe schedule``: a schedule's per-stage action table."""

from __future__ import annotations

import argparse

from hpcpipe.cli.arguments import add_schedule_arguments

NAME = "schedule"
HELP = "print a schedule's per-stage action table"
DESCRIPTION = (
    "Print which action (sF(i): forward of item i, sB(i): backward) "
    "each stage runs, in order, and the most items a stage holds at once."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schedule_arguments(parser, "kind")
    parser.add_argument("--width", type=int, default=None, help="at most this many actions per row")


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.pipeline import schedules

    sch = schedules.build(args.kind, args.stages, args.items).validate()
    print(sch.render(actions_per_line=args.width))
    print("max items in flight per stage:", schedules.max_in_flight(sch))
    return 0
