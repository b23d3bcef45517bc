"""One-way time of a message between rank 0 and the last rank (ping-pong), for the link model.

Run under mpiexec with the two ranks on different nodes: ``python multinode_pingpong.py
BYTES...`` prints ``bytes seconds`` per size on rank 0: the median one-way time of
``REPS`` round trips after two untimed ones (osu_latency's loop, buffer API).
"""

import sys
import time

import numpy as np
from mpi4py import MPI

REPS = 5


def one_way(comm, peer: int, nbytes: int) -> float:
    buf = np.zeros(max(nbytes // 8, 1))
    msg = [buf, MPI.DOUBLE]
    times = []
    for k in range(REPS + 2):
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.Send(msg, peer, 5)
            comm.Recv(msg, peer, 5)
        else:
            comm.Recv(msg, 0, 5)
            comm.Send(msg, 0, 5)
        if k >= 2:
            times.append((time.perf_counter() - t0) / 2)
    return float(np.median(times))


def main() -> None:
    comm = MPI.COMM_WORLD
    peer = comm.size - 1
    for nbytes in (int(x) for x in sys.argv[1:]):
        if comm.rank in (0, peer):
            t = one_way(comm, peer if comm.rank == 0 else 0, nbytes)
            if comm.rank == 0:
                print(nbytes, repr(t), flush=True)
        comm.Barrier()


if __name__ == "__main__":
    main()
