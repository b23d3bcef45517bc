"""SIGTERM to a whole-grid sweep's launcher stops the sweep: the running point flushed and
left incomplete, no other point started, exit 143, no traceback and no rank killed by the
signal (a rank that waited while another ran a point used to die of it: mpiexec then
reported a bad termination and the sweep exited 15)."""

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from mpi4py import MPI

from hpcpipe.run.results import ResultsError, load
from hpcpipe.studies.sweep import load_sweep, point_state, run_points

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ENV.pop("HPCPIPE_DEBUG", None)
SWEEP = """
[sweep]
name = "term"
out = "{out}"
ranks = 1
[base]
problem = "l1-chain"
depth = 2
dim = 8
optimizer = "pprs"
samples = 2
iterations = {iterations}
flush_every = 5
clock = "model"
progress = "off"
[grid]
seed = [0, 1, 2]
"""
WAIT = 120  # s: a hang guard


def _rows(path) -> int:
    try:
        return len(load(path).iterations["iteration"]) if path.exists() else 0
    except ResultsError:
        return 0


@pytest.mark.parametrize(
    ("ranks", "np", "running"),
    [
        (1, 2, 2),  # two points side by side, one per rank
        (2, 3, 1),  # points of 2 ranks: rank 2 waits while ranks 0-1 run a point
    ],
)
def test_sigterm_to_the_launcher_stops_a_whole_grid_sweep(tmp_path, ranks, np, running):
    toml = tmp_path / "s.toml"
    toml.write_text(
        SWEEP.format(out=tmp_path / "out", iterations=100_000).replace(
            "ranks = 1", f"ranks = {ranks}"
        )
    )
    paths = [pt.path for pt in load_sweep(toml).points]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcpipe", "sweep", str(toml), "--np", str(np)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,
    )
    t0 = time.time()
    while (
        proc.poll() is None
        and time.time() - t0 < WAIT
        and min(_rows(p) for p in paths[:running]) < 1
    ):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 143, (proc.returncode, out, err)
    assert "Traceback" not in err and "BAD TERMINATION" not in out + err, (out, err)
    assert "stopped by a signal" in out, out
    states = [point_state(pt) for pt in load_sweep(toml).points]
    assert states == ["incomplete"] * running + ["missing"] * (3 - running), states
    for p in paths[:running]:
        assert 1 <= _rows(p) < 100_000


def test_a_signal_between_points_starts_no_other_point(tmp_path):
    """The flag the sweep's handler raises, seen before a point: nothing more is run."""
    toml = tmp_path / "s.toml"
    toml.write_text(SWEEP.format(out=tmp_path / "out", iterations=3))
    sweep = load_sweep(toml)
    said = []
    counts = run_points(MPI.COMM_SELF, sweep, log=said.append, stop=SimpleNamespace(raised=True))
    assert counts == {"ran": 0, "resumed": 0, "skipped": 0, "stopped": True}
    assert not any(pt.path.exists() for pt in sweep.points) and said == []
    counts = run_points(MPI.COMM_SELF, sweep, log=said.append, stop=SimpleNamespace(raised=False))
    assert counts["ran"] == 3 and not counts["stopped"]
    assert [point_state(pt) for pt in sweep.points] == ["complete"] * 3
