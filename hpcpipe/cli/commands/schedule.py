"""``hpcpipe schedule``: a schedule's per-rank action grid, makespan, bubble and memory."""

from __future__ import annotations

import argparse

from hpcpipe.cli.arguments import schedule_argument

NAME = "schedule"
HELP = "print a schedule's per-rank action grid, makespan, bubble and memory"
DESCRIPTION = (
    "Print which action (sF(i): forward of item i on stage s, sB(i): backward, sI(i) / "
    "sW(i): its input / weight halves) each rank runs, step by step, then the makespan on "
    "the model clock, the bubble fraction and the peak stashed activations per rank."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "kind",
        nargs="?",
        help="the schedule (a registered name or package.module:builder)",
        **schedule_argument(),
    )
    parser.add_argument(
        "--ranks", "--stages", dest="ranks", type=int, default=4, help="ranks P (default 4)"
    )
    parser.add_argument("--items", type=int, default=8, help="work items n per call (default 8)")
    parser.add_argument("--virtual", type=int, default=None, help="stages per rank (interleaved)")
    parser.add_argument("--t-forward", type=float, default=1.0, help="t_F per stage (default 1)")
    parser.add_argument("--t-backward", type=float, default=2.0, help="t_B per stage (default 2)")
    parser.add_argument("--t-input", type=float, default=None, help="t_I (default t_B/2)")
    parser.add_argument("--t-weight", type=float, default=None, help="t_W (default t_B/2)")
    parser.add_argument("--message", type=float, default=0.0, help="message cost c between ranks")
    parser.add_argument("--item-bytes", type=float, default=None, help="bytes one item stashes")
    parser.add_argument("--max-steps", type=int, default=None, help="print at most this many steps")
    parser.add_argument(
        "--from-csv", default="", help="read torch's CSV schedule instead of a name"
    )
    parser.add_argument("--write-csv", default="", help="also write the schedule as torch's CSV")


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.pipeline.summary import schedule_command

    return schedule_command(args)
