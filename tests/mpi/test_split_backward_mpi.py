"""zb-h1 (split backward I / W) on the MPI engine: model clock == simulator, bitwise.

On 1, 2 and 4 ranks, the engine's per-action end times and pipeline time on
the model clock (with α, β > 0 and t_B split into t_I, t_W) equal the
simulator's bit for bit, and its gradient equals 1F1B's (the same arithmetic)
and the single-process reference to <= 1e-12.
"""

import numpy as np
import pytest
from helpers import from_root, sub_comm
from mpi4py import MPI

from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import Engine
from hpcpipe.pipeline.schedules import build
from hpcpipe.pipeline.simulator import message_costs, simulate, stage_times

DEPTH, D, ROWS = 4, 5, 2
COSTS = CostModel.uniform(DEPTH, 1e-3, 3e-3, alpha=5e-5, beta=1e-8, weight_share=0.25)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 4, 8])
def test_zb_h1_engine_equals_simulator_and_1f1b_gradient(P, n):
    spec = ModelSpec("mlp", depth=DEPTH, d_in=D, d_out=D, width=D, head="squared", seed=1)
    batch = random_batch(spec, ROWS * n, seed=2)
    got = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            out = {}
            for name in ("zb-h1", "1f1b"):
                eng = Engine(
                    comm, spec, batch, "weights", name, samples=1, microbatches=n,
                    clock="model", costs=COSTS, wait="sleep",
                )  # fmt: skip
                res = eng.evaluate(eng.initial_point())
                grads = comm.gather(res.grad, root=0)
                ends = comm.gather(eng.events[:, 2].copy(), root=0)
                eng.close()
                out[name] = (res.time, ends, None if grads is None else np.concatenate(grads))
            got = out
    out = from_root(got)
    tf, tb = stage_times(COSTS, DEPTH, P)
    ti = [COSTS.split(t)[0] for t in tb]
    tw = [COSTS.split(t)[1] for t in tb]
    msg = message_costs(COSTS, [D] * (P - 1), [ROWS] * n)
    sim = simulate(build("zb-h1", P, n), tf, tb, msg, t_input=ti, t_weight=tw)
    t_mpi, ends, g_zb = out["zb-h1"]
    assert t_mpi == sim.makespan  # bitwise
    for r in range(P):
        np.testing.assert_array_equal(ends[r], sim.ends[r])
    np.testing.assert_allclose(g_zb, out["1f1b"][2], rtol=0, atol=1e-12)
