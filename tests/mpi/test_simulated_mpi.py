"""executor = "simulated" equals executor = "mpi" on the model clock.

For every schedule with one stage per rank (test_placed_mpi covers the
others), on 1, 2 and 4
ranks (stages = ranks), a short run of the same configuration (chains of dense
and of Householder layers, an MLP) through the run loop: the iterates agree to
<= 1e-12 and the pipeline time of every iteration is bitwise equal.
"""

import numpy as np
import pytest
from helpers import from_root, sub_comm
from mpi4py import MPI

from hpcpipe.pipeline.schedules import SCHEDULES, build
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import gather_theta, make_problem, run

CASES = {
    "pprs-max": dict(problem="max-chain", depth=4, dim=6, samples=3, gamma=0.05, lr=0.05),
    "pprs-max-householder": dict(
        problem="max-chain",
        layers="householder",
        depth=4,
        dim=6,
        samples=3,
        gamma=0.05,
        lr=0.05,
    ),
    "pprs-fewshot": dict(
        problem="fewshot", depth=4, width=6, m=4, microbatches=2, samples=2, gamma=0.01, lr=0.1
    ),
}
COMMON = dict(
    optimizer="pprs",
    iterations=3,
    progress="off",
    seed=3,
    eval_every=0,
    t_forward=1e-3,
    t_backward=2e-3,
    alpha=5e-5,
    beta=1e-8,
)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize(
    "schedule", [s for s in SCHEDULES.names() if build(s, 2, 2).one_stage_per_rank]
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_simulated_equals_mpi_model_clock(case, schedule, P):
    values = {**CASES[case], **COMMON, "schedule": schedule}
    mpi_cfg = make_config({**values, "executor": "mpi"})
    got = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            res = run(mpi_cfg, comm)
            theta = gather_theta(res, comm, make_problem(mpi_cfg, MPI.COMM_SELF))
            got = (theta, res.column("pipeline_time"))
    theta_mpi, time_mpi = from_root(got)
    sim_cfg = make_config({**values, "executor": "simulated", "stages": P})
    sim = run(sim_cfg, MPI.COMM_SELF)
    assert sim.status == "complete"
    np.testing.assert_allclose(sim.theta, theta_mpi, rtol=0, atol=1e-12)
    assert len(time_mpi) == COMMON["iterations"]
    np.testing.assert_array_equal(sim.column("pipeline_time"), time_mpi)  # bitwise
