"""``hpcpipe sweep``: run a grid of configurations, one HDF5 file per point."""

from __future__ import annotations

import argparse
import sys

from hpcpipe.cli.arguments import ranks_option
from hpcpipe.cli.launch import inside_mpi, relaunch, strip_np, under_mpi

NAME = "sweep"
HELP = "run a grid of configurations, one HDF5 file per point"
TAKES_EXTRA = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", help="sweep file (TOML)")
    parser.add_argument("--out", help="results directory (default: the file's [sweep] out)")
    parser.add_argument("--point", type=int, help="run only this grid point (Slurm array task)")
    parser.add_argument("--list", action="store_true", help="list the points and their state")
    parser.add_argument(
        "--np",
        type=ranks_option,
        default=0,
        help="ranks of the launch (default: the largest point's R). Each point runs on the "
        "ranks the sweep file gives it; NP >= 2R runs NP // R points side by side (points of "
        "ranks = 1: --np 2 on 2 cores), ranks past a multiple of R wait; fewer are refused",
    )
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.errors import ConfigError
    from hpcpipe.studies.sweep import describe, load_sweep, main_inside

    try:
        sweep = load_sweep(args.sweep, args.out)
    except ConfigError as e:
        print(f"hpcpipe: config error: {e}", file=sys.stderr)
        return 2
    indices = None
    if args.point is not None:
        if not 0 <= args.point < len(sweep.points):
            print(
                f"hpcpipe: --point {args.point}: the sweep has points 0..{len(sweep.points) - 1}",
                file=sys.stderr,
            )
            return 2
        indices = [args.point]
    if args.list:
        describe(sweep)
        return 0
    launcher = not inside_mpi() and not args.inside
    ranks = max(sweep.points[i].ranks for i in (indices or range(len(sweep.points))))
    if launcher and args.np and args.np != ranks:
        # the sweep file sets each point's ranks; --np only sizes the launch
        where = f"the sweep file gives its points at most {ranks} rank(s) ([sweep] ranks)"
        if args.np < ranks:
            print(f"hpcpipe sweep: --np {args.np} is too few: {where}; drop --np", file=sys.stderr)
            return 2
        if args.np % ranks:
            print(
                f"hpcpipe sweep: note: {where}; --np {args.np} runs {args.np // ranks} point(s) "
                f"side by side and leaves {args.np % ranks} rank(s) idle",
                file=sys.stderr,
            )
    if launcher:
        from hpcpipe.studies.sweep import SweepLock

        try:  # the ranks take it for real; this gives the message before any launch
            SweepLock(sweep.out, shared=indices is not None).release()
        except ConfigError as e:
            print(f"hpcpipe: {e}", file=sys.stderr)
            return 2
    if launcher:
        return relaunch(args.np or ranks, ["sweep", *strip_np(argv[1:]), "--inside"])
    return under_mpi(lambda comm: main_inside(comm, args.sweep, args.out, indices))
