"""The bare loop of `bench dense` computes the engine's gradient; a planted error is seen."""

import numpy as np
import pytest
from helpers import from_root, sub_comm
from mpi4py import MPI

from hpcpipe.bench.dense import bare_gpipe
from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.engine import Engine


def _bare_vs_engine(comm, M, mb, plant=0.0):
    spec = ModelSpec("dense", depth=comm.size, d_in=5, d_out=5, width=5, head="squared", seed=3)
    batch = random_batch(spec, M * mb)
    eng = Engine(comm, spec, batch, "weights", "gpipe", microbatches=M, wait="sleep")
    try:
        ref = eng.evaluate(eng.initial_point(), reduce="sum").grad
        ((w, b),) = eng.stage.views(eng.stage.flat)
    finally:
        eng.close()
    step = bare_gpipe(comm, w.copy(), b.copy() + plant, batch.x, batch.targets, M)
    try:
        for _ in range(2):  # a second step starts from zeroed gradients
            gw, gb = step()
    finally:
        step.free()
    err = np.abs(np.concatenate([gw.ravel(), gb]) - ref).max() / np.abs(ref).max()
    return comm.allreduce(float(err), op=MPI.MAX)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("p,M,mb", [(2, 3, 2), (4, 2, 1)])
def test_bare_loop_gradient_equals_the_engines(p, M, mb):
    err = planted = None
    with sub_comm(p) as comm:
        if comm != MPI.COMM_NULL:
            err = _bare_vs_engine(comm, M, mb)
            planted = _bare_vs_engine(comm, M, mb, plant=1e-3)
    err, planted = from_root((err, planted))
    assert err <= 1e-12
    assert planted > 1e-6  # a wrong bias is seen
