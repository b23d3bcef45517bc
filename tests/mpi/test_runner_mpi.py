"""Distributed runs equal a single-process reference run for the same seed (20 iterations)."""

import numpy as np
import pytest
from helpers import from_root, sub_comm
from mpi4py import MPI

from hpcpipe.model.reference import Reference
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import gather_theta, make_method, make_problem, run

ITERS = 20
CASES = {
    "pprs-l1": dict(
        problem="l1-chain", depth=4, dim=8, optimizer="pprs", samples=5, gamma=0.05, lr=0.05
    ),
    "agd-max": dict(problem="max-chain", depth=4, dim=8, optimizer="agd", lr=0.05),
    "pprs-fewshot": dict(
        problem="fewshot",
        depth=4,
        width=8,
        m=6,
        microbatches=3,
        optimizer="pprs",
        samples=3,
        gamma=0.01,
        lr=0.1,
    ),
    "gd-fewshot": dict(problem="fewshot", depth=4, width=8, m=6, optimizer="gd", lr=0.1),
}


def reference_run(cfg):
    """The same optimizer on the single-process reference oracle (no MPI)."""
    prob = make_problem(cfg, MPI.COMM_SELF)
    method, _ = make_method(cfg, prob)
    ref = Reference(prob.spec, prob.batch, prob.variable, seed=cfg.seed)
    state = method.init(ref.initial_point(), prob.project)
    reg = prob.regulariser
    for it in range(1, ITERS + 1):
        y = method.point(state, prob.project)
        _, g = ref.loss_and_grad(y, method.gamma, it, method.samples)
        state = method.update(state, y, g + reg.grad(y) if reg else g, prob.project)
    return state["theta"]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_distributed_run_equals_reference(case, P):
    cfg = make_config(
        {
            **CASES[case],
            "iterations": ITERS,
            "progress": "off",
            "seed": 2,
            "eval_every": 0,
            "schedule": "1f1b",
        }
    )
    want = reference_run(cfg)
    got = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            res = run(cfg, comm)
            got = gather_theta(res, comm, make_problem(cfg, comm)), res.status, len(res.table)
    theta, status, n = from_root(got)
    assert status == "complete" and n == ITERS
    moved = np.abs(want).max()
    assert moved > 0
    err = np.abs(theta - want).max() / moved
    assert err <= 1e-10, f"{case} on {P} ranks: iterates differ by {err:.3e}"
