"""Every dataset of a result file carries a ``units`` attribute (hpcpipe/run/units.py)."""

import h5py
import pytest
from mpi4py import MPI

from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run
from hpcpipe.run.units import unit_of

ALLOWED = {"s", "tau", "iterations", "1"}


def _write(tmp_path, **over) -> dict[str, str]:
    out = tmp_path / "r.h5"
    values = dict(
        executor="simulated", optimizer="agd", iterations=4, progress="off", output=str(out)
    )
    run(make_config({**values, **over}), MPI.COMM_SELF)
    found: dict[str, str] = {}
    with h5py.File(out, "r", locking=False) as f:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                found[name] = obj.attrs.get("units", None)

        f.visititems(visit)
    return found


@pytest.mark.parametrize("clock, time_unit", [("model", "tau"), ("wall", "s")])
def test_every_dataset_has_units(tmp_path, clock, time_unit):
    # the simulated executor has only the model clock; the wall clock runs on MPI (1 rank)
    over = {"executor": "mpi", "depth": 2} if clock == "wall" else {}
    units = _write(tmp_path, clock=clock, **over)
    assert len(units) > 20 and all(units.values()), [k for k, v in units.items() if not v]
    for name, u in units.items():
        assert set(map(str.strip, str(u).split(","))) <= ALLOWED, (name, u)
    assert units["iterations/pipeline_time"] == time_unit
    assert units["iterations/wall_time"] == "s"
    assert units["iterations/iteration"] == "iterations"
    assert units["iterations/gap"] == "1"
    for name in ("timeline/start", "timeline/end", "timeline/wait", "stages/busy"):
        assert units[name] == time_unit
    assert units["stages/actions"] == "1" and units["timeline/rank"] == "1"
    assert units["state/scalars"] == f"iterations, 1, {time_unit}, 1"
    assert units["state/backup/stage"] == f"{time_unit}, {time_unit}, {time_unit}, 1"
    assert units["state/optimizer/theta"] == "1"


def test_unit_of_follows_the_clock():
    assert unit_of("/iterations/pipeline_time", "tau") == "tau"
    assert unit_of("iterations/pipeline_time", "s") == "s"
    assert unit_of("state/optimizer/scalars", "s") == "1"  # an optimizer array named scalars
