"""Helpers for MPI tests: sub-communicators of P ranks and agreeing assertions."""

from __future__ import annotations

import contextlib

from mpi4py import MPI

WORLD = MPI.COMM_WORLD


@contextlib.contextmanager
def sub_comm(p: int):
    """The first p ranks of COMM_WORLD as a communicator (COMM_NULL on the others)."""
    if WORLD.size < p:
        raise RuntimeError(f"test needs {p} ranks, run with mpiexec -n {p} or more")
    comm = WORLD.Split(0 if WORLD.rank < p else MPI.UNDEFINED, WORLD.rank)
    try:
        yield comm
    finally:
        if comm != MPI.COMM_NULL:
            comm.Free()
        WORLD.Barrier()


def from_root(value):
    """World rank 0's value on every rank, so that all ranks assert the same thing."""
    return WORLD.bcast(value, root=0)
