"""Per-rank summary for the outer runner: counts of passed/failed/skipped tests."""

import json
import os

import pytest


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    out = os.environ.get("HPCPIPE_MPI_REPORT")
    if not out:
        return
    from mpi4py import MPI

    stats = {k: len(v) for k, v in terminalreporter.stats.items() if k}
    path = os.path.join(out, f"rank{MPI.COMM_WORLD.rank}.json")
    with open(path, "w") as fh:
        json.dump(stats, fh)

