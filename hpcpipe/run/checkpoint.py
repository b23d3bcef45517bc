"""Saving and restoring a run's state for ``--resume``, for any optimizer.

The saved state is the optimizer's named state (its θ-shaped arrays gathered
into full vectors on rank 0, its scalars), the loop's tally (next iteration,
best f, pipeline time, first loss) and the per-stage totals of the recorder.
Restoring cuts each full vector back into this rank's part, so a resumed run
on the same number of ranks continues bitwise: the noise is keyed by
iteration and every number of the state comes back exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from hpcpipe.optim.base import OptState, split_state
from hpcpipe.pipeline.recording import Recorder


@dataclass
class Tally:
    """The loop's own numbers: next iteration, best exact f, pipeline time, first loss."""

    next: int = 1
    best: float = math.inf
    mtime: float = 0.0
    first: float = math.nan

    def scalars(self) -> list[float]:
        return [float(self.next), self.best, self.mtime, self.first]


def gather_vector(local: np.ndarray, comm, offsets: list[int]) -> np.ndarray | None:
    """The full vector on rank 0 (buffer-API Gatherv); None elsewhere."""
    counts = list(np.diff(offsets))
    if comm.size == 1:
        return local.copy()
    out = np.empty(offsets[-1]) if comm.rank == 0 else None
    comm.Gatherv([local, MPI.DOUBLE], [out, counts, MPI.DOUBLE] if comm.rank == 0 else None, root=0)
    return out


def layout(state: OptState) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(array names, scalar names) of an optimizer state, as the writer stores them."""
    arrays, scalars = split_state(state)
    return tuple(arrays), tuple(scalars)


def gather(comm, state: OptState, tally: Tally, recorder: Recorder, offsets) -> tuple:
    """(full arrays, optimizer scalars, loop scalars, stage totals) on rank 0, as
    ``Writer.save_state`` takes them (collective; what other ranks get is not used)."""
    arrays, scalars = split_state(state)
    full = {k: gather_vector(v, comm, offsets) for k, v in arrays.items()}
    stage = recorder.stage_summary(comm)
    return full, [float(v) for v in scalars.values()], tally.scalars(), stage


def save(writer, comm, state: OptState, tally: Tally, recorder: Recorder, offsets) -> None:
    """Gather the state to rank 0 and write it (collective; ``writer`` is None off rank 0)."""
    got = gather(comm, state, tally, recorder, offsets)
    if writer is not None:
        writer.save_state(*got)


def restore(
    path: str, comm, state: OptState, tally: Tally, recorder: Recorder, offsets: list[int]
) -> OptState:
    """The state of an incomplete result file on every rank, shaped like ``state``.

    ``state`` is the optimizer's initial state: it names what must be found
    (a file written by another optimizer is refused) and the type of each
    scalar (an int comes back an int).
    """
    from hpcpipe.run.results import ResultsError, read_state

    got = None
    if comm.rank == 0:
        try:
            got = read_state(path)
        except ResultsError as e:
            got = e
    got = comm.bcast(got, root=0)
    if isinstance(got, Exception):
        raise got
    arrays, scalars = split_state(state)
    missing = sorted(set(arrays) - set(got.arrays) | set(scalars) - set(got.opt_scalars))
    if missing:
        raise ResultsError(
            f"{path}: its optimizer state holds {', '.join(sorted(got.arrays))} and "
            f"{', '.join(sorted(got.opt_scalars)) or 'no scalars'}; this optimizer also "
            f"needs {', '.join(missing)}: resume with the optimizer that wrote it"
        )
    size = len(next(iter(got.arrays.values()))) if got.arrays else 0
    n_stages = recorder.engine.schedule.n_ranks
    if size != offsets[-1] or got.stage.shape[0] != n_stages:
        raise ResultsError(
            f"{path}: its state has {size} values on {got.stage.shape[0]} "
            f"stages; this run has {offsets[-1]} on {n_stages}"
        )
    r = comm.rank
    if int(got.scalars[0]) == 1:  # killed before its first save: start from the beginning
        return state
    out: OptState = {k: got.arrays[k][offsets[r] : offsets[r + 1]].copy() for k in arrays}
    out.update({k: type(v)(got.opt_scalars[k]) for k, v in scalars.items()})
    tally.next = int(got.scalars[0])
    tally.best, tally.mtime, tally.first = (float(x) for x in got.scalars[1:4])
    recorder.restore(got.stage, r)
    return out
