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


def _ranks(item) -> int:
    """The rank count of a parametrised MPI test (P, S or p), 0 when it has none."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return max([v for k, v in params.items() if k in ("P", "S", "p") and isinstance(v, int)] + [0])


def pytest_collection_modifyitems(config, items):
    """The fast lane's core: every MPI test function once, at its largest rank count (the
    first such case); its other cases are marked slow (``pytest -m "not slow"`` skips them,
    the full run keeps them)."""
    import pytest

    core: dict[str, object] = {}
    for item in items:
        key = f"{item.module.__name__}::{item.originalname}"
        if key not in core or _ranks(item) > _ranks(core[key]):
            core[key] = item
    chosen = {id(i) for i in core.values()}
    for item in items:
        if id(item) not in chosen:
            item.add_marker(pytest.mark.slow)
