"""With a machine profile, the MPI engine's model clock (seconds) equals the simulated
pipeline's time bitwise, as it does in τ units; the run records the profile."""

import os
import tempfile

import numpy as np
import pytest
from helpers import WORLD, from_root, sub_comm
from mpi4py import MPI

from hpcpipe.machine.profile import dumps
from hpcpipe.mpi_library import library_name
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run

LIBRARY = library_name()


def profile_text(ranks: int) -> str:
    sizes = [8, 4096]
    msg = {
        "alpha": 3.7e-5,
        "beta": 1.3e-9,
        "residual": 0.0,
        "sizes": sizes,
        "hop_seconds": [3.7e-5 + 1.3e-9 * b for b in sizes],
        "wakeup": 1e-5,
        "action_overhead": 7e-6,  # per stage action: spread over a stage's blocks
    }
    return dumps(
        {
            "machine": {"host": "h", "cores": 2, "mpi_library": LIBRARY},
            "placement": {"ranks": ranks, "hosts": ["h"], "ranks_per_host": ranks},
            "message": {p: dict(msg) for p in ("busy", "yield", "sleep")},
            "layers": [
                {"kind": k, "width": 6, "rows": 1, "forward": 2.3e-5, "backward": 4.1e-5}
                for k in ("orthogonal", "dense", "mlp")
            ],
        }
    )


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(
    "case",
    [
        dict(problem="max-chain", depth=4, dim=6, samples=3, gamma=0.05, lr=0.05),
        dict(problem="fewshot", depth=4, width=6, m=4, microbatches=2, samples=2, gamma=0.01),
    ],
)
def test_model_clock_in_seconds_equals_simulator(case, schedule, P):
    folder = from_root(tempfile.mkdtemp(prefix="hpcpipe-machine-") if WORLD.rank == 0 else None)
    path = os.path.join(folder, f"machine-{P}.toml")
    if WORLD.rank == 0:
        with open(path, "w") as fh:
            fh.write(profile_text(P))
    WORLD.Barrier()
    values = dict(
        case,
        optimizer="pprs",
        iterations=3,
        progress="off",
        seed=3,
        eval_every=0,
        schedule=schedule,
        machine=path,
        wait="sleep",
    )
    got, err = None, ""
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            try:
                res = run(make_config({**values, "executor": "mpi"}), comm)
                got = res.column("pipeline_time")
            except Exception as e:  # agreed below: no rank leaves the others in a collective
                err = f"rank {WORLD.rank}: {type(e).__name__}: {e}"
    errors = [e for e in WORLD.allgather(err) if e]
    assert not errors, "; ".join(errors)
    time_mpi = from_root(got)
    sim = run(make_config({**values, "executor": "simulated", "stages": P}), MPI.COMM_SELF)
    assert time_mpi[0] > 0
    np.testing.assert_array_equal(sim.column("pipeline_time"), time_mpi)  # bitwise
    # seconds, not τ: one call costs at least its 2P layer actions of the profile
    assert time_mpi[0] >= 2 * P * 2.3e-5
