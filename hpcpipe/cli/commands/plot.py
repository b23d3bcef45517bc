"""``hpcpipe plot``: pictures of a result (the Gantt chart of one iteration)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpcpipe.cli.files import add_picture_arguments, picture_source

NAME = "plot"
HELP = "pictures of a result"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["timeline"], help="timeline: Gantt chart of an iteration")
    add_picture_arguments(
        parser, output="PNG file to write", iteration="default: the last recorded"
    )


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.run.trace import gantt_png, timeline_rows

    got = picture_source(args, default_last=True)
    if isinstance(got, int):
        return got
    r, it = got
    clock = str(r.attrs.get("clock", "wall"))
    gantt_png(
        timeline_rows(r.timeline, it),
        args.output,
        f"{Path(args.result).name}: iteration {it} ({clock} clock)",
        "τ, model time unit" if clock == "model" else "s",
    )
    print(f"wrote {args.output}")
    return 0
