"""The watchdog on one node (no root): a silent or dead peer before a collective, and in a run.

Each case runs its own ``mpiexec`` (the job is aborted, so it cannot run inside the MPI
suite). A rank that stops before a collective must make the others end the job within
the watchdog's bound with one line naming it and its host, no traceback; without the
watchdog the same job waits for the silent rank (the control that shows the check can
fail).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcpipe.cli.launch import mpiexec_command
from hpcpipe.pipeline.watchdog import AUTO_FACTOR, AUTO_FLOOR, effective_timeout
from hpcpipe.run.results import load

HERE = Path(__file__).parent
PEER = HERE / "watchdog_peer.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", HPCPIPE_PROGRESS="off")
ENV.pop("HPCPIPE_DEBUG", None)
ENV.pop("HPCPIPE_LAUNCHER_PID", None)
HOST = socket.gethostname()
# the silent rank sleeps an hour: a job that ends well before has been ended by the watchdog
BOUND = 240.0


def launch(n: int, args: list[str], limit: float, cwd: Path | None = None):
    """(exit code or None when still running after ``limit`` s, stdout, stderr, seconds)."""
    cmd = mpiexec_command(n, args)
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, cwd=cwd,
    )  # fmt: skip
    try:
        out, err = p.communicate(timeout=limit)
        return p.returncode, out, err, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err, time.monotonic() - t0


def lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("hpcpipe:")]


OPS = [
    "barrier",
    "bcast",
    "allreduce",
    "allgather",
    "gather",
    "object-bcast",
    "object-gather",
    "sendrecv",
]


@pytest.mark.parametrize("op", OPS)
def test_a_silent_rank_before_a_collective_is_named(op):
    rc, out, err, took = launch(3, [str(PEER), op, "1", "sleep", "2"], BOUND)
    assert rc is not None, f"{op}: still waiting after {took:.0f} s\n{err[-2000:]}"
    assert rc != 0, out + err
    assert "round 1" in out, out  # a root may run ahead of a silent leaf, to the barrier
    reports = lines(err)
    assert len(reports) == 1, err
    assert re.fullmatch(
        rf"hpcpipe: rank 0 of 3 failed: watchdog: lost rank 1 on {re.escape(HOST)} \(no "
        r"progress for 2 s, no answer within 2 s\): rank 0 waits in an? \w+.*",
        reports[0],
    ), reports[0]
    assert "Traceback" not in err
    print(f"{op}: ended after {took:.1f} s")


def test_the_lowest_live_rank_reports_when_rank_0_is_silent():
    rc, out, err, took = launch(3, [str(PEER), "allreduce", "0", "sleep", "2"], BOUND)
    assert rc is not None and rc != 0, err
    reports = lines(err)
    assert len(reports) == 1 and reports[0].startswith("hpcpipe: rank 1 of 3 failed:"), err
    assert f"lost rank 0 on {HOST}" in reports[0], reports[0]


def test_a_rank_that_exits_before_a_collective_does_not_hang_the_job():
    rc, out, err, took = launch(3, [str(PEER), "allreduce", "1", "exit", "2"], BOUND)
    assert rc is not None and rc != 0, err
    assert "Traceback" not in err
    for line in lines(err):  # the launcher may end the job first; a report must be right
        assert f"lost rank 1 on {HOST}" in line, line


def test_without_the_watchdog_the_job_waits_for_the_silent_rank():
    """The control: timeout 0 leaves the collective unbounded (the job is killed here)."""
    rc, out, err, took = launch(3, [str(PEER), "allreduce", "1", "sleep", "0"], 20)
    assert rc is None and "round 1" in out, (rc, out, err)


def test_a_run_with_a_silent_rank_ends_with_one_line_and_resumes(tmp_path):
    """`hpcpipe run` on 3 ranks, rank 2 silent from iteration 4: one line naming rank 2,
    the file incomplete with its flushed rows; --resume (no fault) completes it."""
    out = tmp_path / "silent.h5"
    base = ["--problem", "l1-chain", "--depth", "3", "--dim", "8", "--optimizer", "gd",
            "--iterations", "12", "--flush-every", "1", "--progress", "off"]  # fmt: skip
    args = ["-m", "hpcpipe", "run", *base, "--output", str(out), "--timeout", "2",
            "--inject-failure", "2:4:hang"]  # fmt: skip
    rc, _, err, took = launch(3, args, BOUND, cwd=tmp_path)
    assert rc is not None and rc != 0, err
    reports = lines(err)
    assert len(reports) == 1 and f"lost rank 2 on {HOST}" in reports[0], err
    assert "Traceback" not in err
    cut = load(out)
    assert cut.status == "incomplete" and len(cut.iterations["iteration"]) >= 3
    rc, _, err, _ = launch(
        3, ["-m", "hpcpipe", "run", "--resume", str(out), "--inject-failure", "",
            "--progress", "off"], BOUND, cwd=tmp_path,
    )  # fmt: skip
    assert rc == 0, err
    done = load(out)
    assert done.status == "complete" and len(done.iterations["iteration"]) == 12


def test_a_watched_run_gives_the_same_numbers(tmp_path):
    """Every collective of a run through the watchdog (timeout 60) gives the iterates,
    losses and model-clock times of the unwatched run (timeout 0), bitwise."""
    import h5py
    import numpy as np

    base = ["-m", "hpcpipe", "run", "--problem", "l1-chain", "--depth", "3", "--dim", "8",
            "--optimizer", "pprs", "--samples", "2", "--gamma", "0.05", "--iterations", "15",
            "--flush-every", "4", "--clock", "model", "--progress", "off"]  # fmt: skip
    got = {}
    for t in ("0", "60"):
        out = tmp_path / f"t{t}.h5"
        rc, _, err, _ = launch(3, [*base, "--timeout", t, "--output", str(out)], BOUND)
        assert rc == 0, err
        r = load(out)
        with h5py.File(out, "r") as f:
            theta = f["state/optimizer/theta"][()]
        got[t] = (theta, r.iterations["loss"], r.iterations["pipeline_time"])
        assert float(r.config["timeout"]) == float(t)
    for a, b in zip(got["0"], got["60"]):
        assert np.array_equal(a, b)


def test_the_automatic_timeout_is_on_under_slurm_only():
    assert effective_timeout(-1, 1.0, env={}) == 0.0
    assert effective_timeout(-1, 0.0, env={"SLURM_JOB_ID": "7"}) == AUTO_FLOOR
    assert effective_timeout(-1, 10.0, env={"SLURM_JOB_ID": "7"}) == AUTO_FACTOR * 10.0
    assert effective_timeout(0, 10.0, env={"SLURM_JOB_ID": "7"}) == 0.0  # off when asked
    assert effective_timeout(5, 10.0, env={"SLURM_JOB_ID": "7"}) == 5.0


def test_python_runs_the_peer_script():  # the script's own checks of the collectives
    rc, out, err, _ = launch(3, [str(PEER), "object-gather", "9", "sleep", "2"], BOUND)
    assert rc == 0 and "round 3" in out, err
    rc, out, err, _ = launch(2, [str(PEER), "allgather", "9", "sleep", "2"], BOUND)
    assert rc == 0 and "round 3" in out, err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
