"""Resuming a run made with ``inject_failure``: the injection may be cleared, and the file
records it (``resume_overrides``), for this resume and every later one."""

import json

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.cli.main import main
from hpcpipe.run.config import make_config
from hpcpipe.run.results import load
from hpcpipe.run.runner import run

SMALL = dict(
    problem="l1-chain",
    depth=2,
    dim=4,
    optimizer="pprs",
    samples=2,
    gamma=0.05,
    lr=0.05,
    iterations=12,
    flush_every=3,
    clock="model",
    progress="off",
)


def test_clearing_the_injection_on_resume_finishes_the_run(tmp_path, capsys):
    path, ref = tmp_path / "inj.h5", tmp_path / "ref.h5"
    with pytest.raises(RuntimeError, match="injected failure on rank 0 at iteration 5"):
        run(make_config({**SMALL, "inject_failure": "0:5", "output": str(path)}), MPI.COMM_SELF)
    assert load(path).status == "incomplete"
    assert main(["run", "--resume", str(path)]) != 0  # kept: it fails there again
    assert "injected failure on rank 0 at iteration 5" in capsys.readouterr().err
    assert main(["run", "--resume", str(path), "--inject-failure", "0:7"]) == 2
    err = capsys.readouterr().err
    assert "--inject_failure '0:7' cannot be changed on resume" in err
    assert "clear inject_failure (--inject-failure '')" in err
    assert main(["run", "--resume", str(path), "--inject-failure", ""]) == 0
    r = load(path)
    assert r.status == "complete" and r.iterations["iteration"].tolist() == list(range(1, 13))
    assert json.loads(r.attrs["resume_overrides"]) == [{"resume": 2, "inject_failure": ""}]
    assert r.config["inject_failure"] == "0:5"  # the original run's settings stay as run
    run(make_config({**SMALL, "output": str(ref)}), MPI.COMM_SELF)
    with h5py.File(path, "r") as f, h5py.File(ref, "r") as g:
        for k in g["state/optimizer"]:
            a, b = f[f"state/optimizer/{k}"][()], g[f"state/optimizer/{k}"][()]
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(r.iterations["loss"], load(ref).iterations["loss"])


def test_a_cleared_injection_stays_cleared_on_later_resumes(tmp_path, capsys):
    path = tmp_path / "inj.h5"
    with pytest.raises(RuntimeError):
        run(make_config({**SMALL, "inject_failure": "0:5", "output": str(path)}), MPI.COMM_SELF)
    with h5py.File(path, "r+") as f:  # as a cleared resume that was itself stopped leaves it
        f.attrs["resume_overrides"] = json.dumps([{"resume": 1, "inject_failure": ""}])
    assert main(["run", "--resume", str(path)]) == 0
    assert load(path).status == "complete"
