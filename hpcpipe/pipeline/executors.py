"""Executors: what evaluates the oracle of a run, looked up by the config key ``executor``.

An executor has the MPI engine's surface: ``evaluate(point, gamma=0.0,
call=0, reduce="mean")`` returning ``.loss .losses .grad .time
.item_losses``, ``initial_point()``, ``schedule``, ``size`` (ranks the point
is split over), ``close()``.

* ``mpi``: ``engine.Engine``, the stages the schedule places on each MPI rank
  (the ground truth; wall or model clock);
* ``simulated``: ``simulated.SimulatedPipeline``, S stages in one process,
  each call timed by the schedule simulator on the model clock (equal to the
  MPI model clock bitwise; reaches Δ in the thousands);
* ``reduced``: the simulated pipeline of a Householder chain, timed on its
  Δ stages, computed on its first block (``reduced.py``: equal to
  ``simulated`` up to rounding without smoothing noise, in distribution
  with it).

A factory is called as ``factory(comm, spec, batch, *, variable, schedule,
samples, microbatches, seed, clock, costs, wait, timeout, weights,
layer_time, stages)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from hpcpipe.registry import Registry


class Executor(Protocol):
    """The oracle the run loop calls; ``with`` closes it on every path."""

    schedule: Any
    size: int

    def evaluate(self, point: np.ndarray, gamma: float = 0.0, call: int = 0) -> Any: ...

    def initial_point(self) -> np.ndarray: ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc) -> None: ...


def mpi_engine(comm, spec, batch, *, stages: int = 0, **kw):
    """The MPI engine on ``comm`` (its stage count is the rank count)."""
    from hpcpipe.pipeline.engine import Engine

    if stages not in (0, comm.size):
        raise ValueError(f"the MPI engine runs on its ranks: stages = {stages} != {comm.size}")
    eng = Engine(comm, spec, batch, **kw)
    if kw.get("variable") == "weights" and not eng.schedule.one_stage_per_rank:
        from hpcpipe.errors import ConfigError

        eng.close()
        raise ConfigError(
            f"schedule = {eng.schedule.name!r}: it places several stages on a rank, and a run "
            "whose variable is the weights keeps one stage per rank on MPI (the run's state "
            "is laid out by rank): use a one-stage schedule (gpipe, 1f1b, zb-h1) or "
            "executor = 'simulated'"
        )
    return eng


def simulated_pipeline(comm, spec, batch, *, stages: int = 0, **kw):
    """The simulated pipeline of ``stages`` stages (default: one per block) in this process."""
    from hpcpipe.pipeline.simulated import SimulatedPipeline

    if comm is not None and comm.size != 1:
        raise ValueError(f"the simulated pipeline runs in one process, not {comm.size} ranks")
    for unused in ("clock", "wait", "timeout", "layer_time"):
        kw.pop(unused, None)
    return SimulatedPipeline(spec, batch, stages=stages, **kw)


EXECUTORS: Registry[Callable] = Registry("executor")
EXECUTORS.register("mpi", mpi_engine)
EXECUTORS.register("simulated", simulated_pipeline)


def reduced_pipeline(comm, spec, batch, **kw):
    """The reduced route (``reduced.py``)."""
    from hpcpipe.pipeline.reduced import reduced_pipeline as make

    return make(comm, spec, batch, **kw)


EXECUTORS.register("reduced", reduced_pipeline)

__all__ = ["EXECUTORS", "Executor", "mpi_engine", "reduced_pipeline", "simulated_pipeline"]
