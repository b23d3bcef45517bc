"""The ``hpcpipe`` command line."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def cmd_schedule(args) -> int:
    from . import schedules

    sch = schedules.build(args.kind, args.stages, args.items).validate()
    print(sch.render(actions_per_line=args.width))
    print("max items in flight per stage:", schedules.max_in_flight(sch))
    return 0


def cmd_info(args) -> int:
    import h5py
    import mpi4py
    import numpy
    from mpi4py import MPI

    print(f"hpcpipe {__version__}")
    print(f"numpy {numpy.__version__}, mpi4py {mpi4py.__version__}, h5py {h5py.__version__}")
    print(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}")
    from .launch import LauncherError, find_mpiexec

    try:
        print(f"mpiexec: {find_mpiexec()}")
    except LauncherError as e:
        print(f"mpiexec: {e}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcpipe", description=__doc__)
    p.add_argument("--version", action="version", version=f"hpcpipe {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("schedule", help="print a schedule's per-stage action table")
    s.add_argument("kind", choices=["sequential", "gpipe", "1f1b"])
    s.add_argument("--stages", type=int, default=4)
    s.add_argument("--items", type=int, default=8)
    s.add_argument("--width", type=int, default=None, help="at most this many actions per row")
    s.set_defaults(func=cmd_schedule)

    s = sub.add_parser("info", help="versions of hpcpipe, numpy, mpi4py, h5py and the MPI library")
    s.set_defaults(func=cmd_info)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
