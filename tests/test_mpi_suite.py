"""Runs the MPI tests (tests/mpi) under `mpiexec -n 4 pytest --with-mpi`.

This is what makes the plain `pytest` command run the MPI tests: the test
fails if mpiexec is missing, if any MPI test fails on any rank, or if the
MPI tests were skipped or not collected.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcpipe.cli.launch import mpiexec_command

HERE = Path(__file__).parent
RANKS = 4
TIMEOUT = 900


# The core (every MPI test function once, at its largest rank count: tests/mpi/conftest.py)
# runs in the fast lane; the other cases only in the full run. Together: every MPI test once.
PARTS = [
    pytest.param("not slow", 9, id="core"),
    pytest.param("slow", 20, id="rest", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("selection, at_least", PARTS)
def test_mpi_suite(tmp_path, selection, at_least):
    env = dict(
        os.environ,
        HPCPIPE_MPI_SUITE="1",
        HPCPIPE_MPI_REPORT=str(tmp_path),
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    cmd = mpiexec_command(
        RANKS,
        ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-m", selection]
        + [str(HERE / "mpi")],
    )
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT, cwd=HERE.parent
    )
    log = proc.stdout[-20000:] + "\n" + proc.stderr[-5000:]
    assert proc.returncode == 0, f"MPI tests failed ({' '.join(cmd)}):\n{log}"
    reports = sorted(tmp_path.glob("rank*.json"))
    assert len(reports) == RANKS, f"expected {RANKS} rank reports, got {len(reports)}:\n{log}"
    counts = [json.loads(p.read_text()) for p in reports]
    for c in counts:
        assert c.get("failed", 0) == 0 and c.get("error", 0) == 0, log
        assert c.get("passed", 0) >= at_least, f"too few MPI tests ran: {c}\n{log}"
        assert c.get("skipped", 0) == 0, f"MPI tests were skipped: {c}\n{log}"
    print(f"MPI suite on {RANKS} ranks: {counts[0]}", file=sys.stderr)
