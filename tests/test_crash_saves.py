"""Crash-consistent saves: kill -9 of rank 0 at every step of a save, then resume.

A save appends the rows and flushes them, copies the previous state to /state/backup,
marks the backup as the one to resume from, rewrites /state and marks it whole again
(results.Writer.save_state). A test hook (results.SAVE_HOOK) names each step; the killed
process sends itself SIGKILL there, so each case is the same on a loaded machine. Every
case must resume (never "the state runs ahead of the rows") and reach the uninterrupted
run's final iterate, losses and model-clock pipeline times bitwise.
"""

import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest
from _procs import ENV, SMALL, cli_args
from mpi4py import MPI

from hpcpipe.cli.launch import mpiexec_command
from hpcpipe.cli.main import main
from hpcpipe.run import results
from hpcpipe.run.config import make_config
from hpcpipe.run.results import load, read_state
from hpcpipe.run.runner import run

ARGS = cli_args(SMALL)
# the steps of one save, in order (Run.flush, then Writer.save_state)
POINTS = (
    "rows-written",
    "rows-flushed",
    "backup-started",
    "backup-written",
    "backup-flushed",
    "backup-committed",
    "state-started",
    "state-written",
    "state-flushed",
    "state-committed",
)
KILLER = """
import os, signal, sys
from hpcpipe.run import results
point, nth = sys.argv[1], int(sys.argv[2])
seen = {}
def hook(p):
    seen[p] = seen.get(p, 0) + 1
    if p == point and seen[p] == nth:
        os.kill(os.getpid(), signal.SIGKILL)
results.SAVE_HOOK = hook
from hpcpipe.cli.main import main
sys.exit(main(sys.argv[3:]))
"""
WAIT = 120  # s: a hang guard for every process of these tests


@contextmanager
def _hang_guard(seconds: int = WAIT):
    """A resume in this process that does not end in ``seconds`` fails the test (SIGALRM)."""

    def hung(signum, frame):
        raise TimeoutError(f"the resume did not end in {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _final(path: Path) -> dict[str, np.ndarray]:
    """What must match bitwise: the final iterate, the losses, the model-clock times."""
    r = load(path)
    out = {k: r.iterations[k] for k in ("iteration", "loss", "pipeline_time")}
    out.update({f"timeline/{k}": r.timeline[k] for k in ("iteration", "start", "end")})
    with h5py.File(path, "r") as f:
        for k in f["state/optimizer"]:
            out[f"state/{k}"] = f[f"state/optimizer/{k}"][()]
    assert r.status == "complete", (path, r.status)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.h5"
    run(make_config({**SMALL, "output": str(path)}), MPI.COMM_SELF)
    return _final(path)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Every (point, nth save) case, killed in its own process, a few at a time."""
    d = tmp_path_factory.mktemp("killed")
    script = d / "killer.py"
    script.write_text(KILLER)
    cases = [(p, n) for n in (1, 3) for p in POINTS]

    def one(case):
        point, nth = case
        out = d / f"{point}-{nth}.h5"
        p = subprocess.run(
            [sys.executable, str(script), point, str(nth), "run", *ARGS, "--output", str(out)],
            capture_output=True,
            text=True,
            timeout=WAIT,
            env=ENV,
        )
        return case, out, p

    with ThreadPoolExecutor(4) as pool:
        return {case: (out, p) for case, out, p in pool.map(one, cases)}


@pytest.mark.parametrize("nth", (1, 3))
@pytest.mark.parametrize("point", POINTS)
def test_kill_9_of_rank_0_inside_a_save_then_resume(point, nth, killed, reference, capsys):
    out, p = killed[(point, nth)]
    assert p.returncode == -9, p.stderr  # killed there, not finished
    st = read_state(out)  # never "the state runs ahead of the rows"
    rows = load(out).iterations["iteration"]
    assert load(out).status == "incomplete"
    assert (rows[-1] if len(rows) else 0) >= st.scalars[0] - 1
    with _hang_guard():
        assert main(["run", "--resume", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "as h5clear -s does" in err, err
    got = _final(out)
    assert got.keys() == reference.keys()
    for k, v in reference.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_a_torn_state_is_never_resumed_from(tmp_path):
    """Why the backup: a save stopped after /state's first array leaves /state with a new
    array and the old iteration (resuming from it would silently give other iterates);
    commit = [1] then sends read_state to the backup, whose arrays and iteration agree."""
    path = tmp_path / "torn.h5"
    hits = []

    def hook(point):
        hits.append(point)
        if point == "state-started" and hits.count(point) == 2:
            raise KeyboardInterrupt  # stop in this process, at the same step

    results.SAVE_HOOK = hook
    try:
        with pytest.raises(KeyboardInterrupt):
            run(make_config({**SMALL, "output": str(path)}), MPI.COMM_SELF)
    finally:
        results.SAVE_HOOK = None
    with h5py.File(path, "r") as f:
        assert f["state/commit"][()].tolist() == [1]  # /state is being rewritten
        names = list(f["state/optimizer"])
        torn = [f[f"state/optimizer/{k}"][()] for k in names]
        backup = [f[f"state/backup/optimizer/{k}"][()] for k in names]
        next_state = f["state/scalars"][0]
        next_backup = f["state/backup/scalars"][0]
    # /state holds one new array but the old iteration: resuming from it would be wrong
    same = [np.array_equal(a, b) for a, b in zip(torn, backup)]
    assert same.count(False) == 1 and next_state == next_backup == 3, same
    st = read_state(path)
    for k, v in zip(names, backup):
        np.testing.assert_array_equal(st.arrays[k], v)
    assert st.scalars[0] == 3


def test_kill_9_of_rank_0_of_two_inside_a_save_then_resume(tmp_path):
    """Under MPI: rank 0 dies inside a save, mpiexec brings rank 1 down, the resume on
    two ranks ends where an uninterrupted two-rank run ends."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    ref, out = tmp_path / "ref.h5", tmp_path / "cut.h5"
    env = dict(ENV, HPCPIPE_INSIDE_MPI="1")
    launch = [sys.executable, "-m", "hpcpipe", "run", "--np", "2", *ARGS, "--output", str(ref)]
    p = subprocess.run(launch, capture_output=True, text=True, timeout=WAIT, env=ENV)
    assert p.returncode == 0, p.stderr
    cmd = mpiexec_command(
        2, [str(script), "state-started", "2", "run", *ARGS, "--output", str(out)]
    )
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT, env=env)
    assert p.returncode != 0
    assert load(out).status == "incomplete"
    p = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "run", "--np", "2", "--resume", str(out)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=ENV,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    a, b = _final(ref), _final(out)
    for k, v in a.items():
        np.testing.assert_array_equal(b[k], v, err_msg=k)
