"""``hpcpipe demo``: GD, AGD and PPRS on the digits attack, on local ranks."""

from __future__ import annotations

import argparse

from hpcpipe.cli.arguments import ranks_option
from hpcpipe.cli.launch import inside_mpi, relaunch, strip_np, under_mpi

NAME = "demo"
HELP = "GD vs AGD vs PPRS on the digits attack, 4 local ranks"
TAKES_EXTRA = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--np", type=ranks_option, default=4, help="number of ranks (default 4)")
    parser.add_argument("--budget", type=float, default=0.0, help="pipeline time budget in tau")


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    if not inside_mpi():
        return relaunch(args.np, strip_np(argv))

    def body(comm) -> int:
        from hpcpipe.run.demo import demo

        return demo(comm, budget=args.budget)

    return under_mpi(body)
