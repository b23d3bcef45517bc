"""``hpcpipe trace``: a result's timeline as Chrome trace JSON (open in Perfetto)."""

from __future__ import annotations

import argparse

from hpcpipe.cli.files import add_picture_arguments, picture_source

NAME = "trace"
HELP = "a result's timeline as Chrome trace JSON (Perfetto)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_picture_arguments(parser, output="JSON file to write", iteration="only this iteration")


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.run.trace import write_trace

    got = picture_source(args, default_last=False)
    if isinstance(got, int):
        return got
    r, it = got
    its = None if it is None else [it]
    clock = str(r.attrs.get("clock", "wall"))
    flush_every = int(r.config.get("flush_every", 0))
    n = write_trace(r.timeline, args.output, clock, its, r.iterations, flush_every)
    unit = "1 us drawn = 1 tau" if clock == "model" else "wall-clock time"
    print(
        f"wrote {n} trace events to {args.output} ({clock} clock, {unit}; open in ui.perfetto.dev)"
    )
    return 0
