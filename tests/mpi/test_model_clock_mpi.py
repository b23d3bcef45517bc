"""Model clock of a real MPI run == simulator == closed form (non-zero α and β)."""

import math

import numpy as np
import pytest
from helpers import from_root, sub_comm
from mpi4py import MPI

from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import Engine
from hpcpipe.pipeline.schedules import build
from hpcpipe.pipeline.simulator import closed_form, message_costs, simulate, stage_times

DEPTH, D, ROWS = 4, 5, 2
COSTS = CostModel.uniform(DEPTH, 1e-3, 2e-3, alpha=5e-5, beta=1e-8)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("S", [2, 4])
@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize("name", ["sequential", "gpipe", "1f1b"])
def test_model_clock_equals_simulator_and_closed_form(S, n, name):
    spec = ModelSpec("orthogonal", depth=DEPTH, d_in=D, d_out=D, head="squared", seed=1)
    batch = random_batch(spec, ROWS * n, seed=2)
    got = None
    with sub_comm(S) as comm:
        if comm != MPI.COMM_NULL:
            eng = Engine(
                comm,
                spec,
                batch,
                "input",
                name,
                samples=1,
                microbatches=n,
                clock="model",
                costs=COSTS,
                wait="sleep",
            )
            res = eng.evaluate(eng.initial_point())
            ends = comm.gather(eng.events[:, 2].copy(), root=0)
            eng.close()
            got = (res.time, ends)
    t_mpi, ends = from_root(got)
    tf, tb = stage_times(COSTS, DEPTH, S)
    msg = message_costs(COSTS, [D] * (S - 1), [ROWS] * n)
    sim = simulate(build(name, S, n), tf, tb, msg)
    assert t_mpi == sim.makespan  # same operations in the same order: bitwise equal
    for s in range(S):
        np.testing.assert_array_equal(ends[s], sim.ends[s])
    c = COSTS.message(ROWS * D * 8)
    assert math.isclose(t_mpi, closed_form(name, S, n, tf[0], tb[0], c), rel_tol=1e-12)
