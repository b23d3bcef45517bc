"""Run under mpiexec by tests/test_watchdog.py: a dead or silent peer before a collective.

``python watchdog_peer.py OP RANK HOW TIMEOUT``: every rank runs a few rounds of the
collective OP (barrier, bcast, allreduce, allgather, gather, object-bcast, object-gather,
sendrecv: blocking Send / Recv)
on a communicator bounded by the watchdog; at round 2, rank RANK stops before it, by
HOW (``sleep``: sleeps for an hour; ``exit``: exits 3 without MPI_Finalize).
Rank 0 prints ``round N`` after each completed round; all end in a barrier.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcpipe.cli.launch import under_mpi
from hpcpipe.pipeline.watchdog import watched

OP, RANK, HOW, TIMEOUT = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])


def body(world) -> int:
    comm = watched(world, TIMEOUT)
    buf = np.zeros(4)
    every = np.zeros((comm.size, 4))
    for rnd in range(4):
        if rnd == 2 and comm.rank == RANK:
            if HOW == "exit":
                os._exit(3)  # a crashed rank: gone without MPI_Finalize
            time.sleep(3600)
        buf[:] = comm.rank + rnd
        if OP == "barrier":
            comm.Barrier()
        elif OP == "bcast":
            comm.Bcast([buf, MPI.DOUBLE], root=0)
        elif OP == "allreduce":
            comm.Allreduce(MPI.IN_PLACE, [buf, MPI.DOUBLE], op=MPI.SUM)
        elif OP == "allgather":
            comm.Allgather([buf, MPI.DOUBLE], [every, MPI.DOUBLE])
            assert every[:, 0].tolist() == [r + rnd for r in range(comm.size)]
        elif OP == "gather":
            comm.Gatherv([buf, MPI.DOUBLE], [every, MPI.DOUBLE] if comm.rank == 0 else None)
        elif OP == "object-bcast":
            got = comm.bcast({"round": rnd} if comm.rank == 0 else None, root=0)
            assert got == {"round": rnd}
        elif OP == "object-gather":
            got = comm.gather(("rank", comm.rank), root=0)
            if comm.rank == 0:
                assert got == [("rank", r) for r in range(comm.size)]
        elif OP == "sendrecv":  # rank 0 receives from every other rank in turn
            if comm.rank == 0:
                for r in range(1, comm.size):
                    comm.Recv([buf, MPI.DOUBLE], source=r, tag=rnd)
                    assert buf[0] == r + rnd
            else:
                comm.Send([buf, MPI.DOUBLE], dest=0, tag=rnd)
        else:
            raise SystemExit(f"unknown op {OP}")
        if comm.rank == 0:
            print(f"round {rnd}", flush=True)
    comm.Barrier()  # as a run ends: a root whose broadcasts completed still waits for all
    return 0


if __name__ == "__main__":
    sys.exit(under_mpi(body))
