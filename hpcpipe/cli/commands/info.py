"""``hpcpipe info``: the versions of hpcpipe, its libraries and the MPI library."""

from __future__ import annotations

import argparse

NAME = "info"
HELP = "versions of hpcpipe, numpy, mpi4py, h5py and the MPI library"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options."""


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    import h5py
    import mpi4py
    import numpy

    from hpcpipe import __version__
    from hpcpipe.cli.launch import LauncherError, find_mpiexec
    from hpcpipe.mpi_library import library_name

    print(f"hpcpipe {__version__}")
    print(f"numpy {numpy.__version__}, mpi4py {mpi4py.__version__}, h5py {h5py.__version__}")
    print(f"MPI: {library_name()}")
    try:
        print(f"mpiexec: {find_mpiexec()}")
    except LauncherError as e:
        print(f"mpiexec: {e}")
    return 0
