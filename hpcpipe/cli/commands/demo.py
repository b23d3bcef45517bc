"""``hpcpipe demo``: the crossover (PPRS overtakes pipelined GD as the pipeline deepens) or
the digits attack (GD, AGD and PPRS in one pipeline budget), on local ranks."""

from __future__ import annotations

import argparse

from hpcpipe.cli.arguments import ranks_option
from hpcpipe.cli.launch import inside_mpi, relaunch, strip_np, under_mpi

NAME = "demo"
HELP = "PPRS overtakes pipelined GD as the pipeline deepens (4 local ranks + simulated)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "which",
        nargs="?",
        default="crossover",
        choices=("crossover", "attack"),
        help="crossover (default): time to eps against depth, the crossover depth measured "
        "and predicted; attack: GD vs AGD vs PPRS on the digits attack, same pipeline budget",
    )
    parser.add_argument("--np", type=ranks_option, default=4, help="number of ranks (default 4)")
    parser.add_argument(
        "--figure",
        default="hpcpipe-demo.png",
        help="crossover: the picture (a new name if it exists; default hpcpipe-demo.png)",
    )
    parser.add_argument("--no-figure", action="store_true", help="crossover: draw no picture")
    parser.add_argument(
        "--budget", type=float, default=0.0, help="attack: pipeline time budget in tau"
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines on stderr (they show on waits over 2 s: the attack's "
        "classifier training on first use, the simulated runs)",
    )


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.optional import MissingExtra, available, missing_message

    if args.which == "attack" and not available("sklearn"):  # before launching: digits
        raise MissingExtra(missing_message("sklearn", "paper", "the demo (digits attack)"))
    if not inside_mpi():
        return relaunch(args.np, strip_np(argv))

    progress = "off" if args.quiet else "auto"

    def body(comm) -> int:
        if args.which == "attack":
            from hpcpipe.demos.attack import demo

            return demo(comm, budget=args.budget, progress=progress)
        from hpcpipe.demos.crossover import demo as crossover

        figure = None if args.no_figure else args.figure
        return crossover(comm, figure_path=figure, progress=progress)

    return under_mpi(body)
