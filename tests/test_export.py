"""Tables for people outside HDF5: frame() in schema order, CSV and Parquet export."""

import importlib.util

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.cli.main import main
from hpcpipe.run import export as export_mod
from hpcpipe.run.config import make_config
from hpcpipe.run.export import ExportError, export, read_csv
from hpcpipe.run.results import STAGE_FIELDS, TIMELINE_FLOAT, TIMELINE_INT, load
from hpcpipe.run.runner import COLUMNS, run

TABLES = ("iterations", "timeline", "stages")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "r.h5"
    cfg = make_config(
        dict(
            problem="l1-chain",
            depth=2,
            dim=4,
            samples=2,
            gamma=0.05,
            iterations=6,
            output=str(path),
            progress="off",
            timeline_limit=3,
        )
    )
    run(cfg, MPI.COMM_SELF)
    return load(path)


def test_frame_columns_follow_the_schema(result):
    pytest.importorskip("pandas")
    assert list(result.frame().columns) == list(COLUMNS)
    assert list(result.frame("stages").columns) == list(STAGE_FIELDS)
    tl = result.frame("timeline")
    assert list(tl.columns) == [*TIMELINE_INT, *TIMELINE_FLOAT, "action", "compute", "receive_wait"]
    assert set(tl["action"].str[0]) == {"F", "B"}
    np.testing.assert_array_equal(tl["compute"], tl["end"] - tl["start"])
    assert len(tl) == len(result.timeline["end"]) > 0


def test_csv_export_round_trips_every_table_bitwise(result, tmp_path):
    paths = export(result, "csv", tmp_path / "out")
    assert [p.name for p in paths] == [
        "out-iterations.csv",
        "out-timeline.csv",
        "out-stages.csv",
        "out-attributes.json",
    ]
    for table, path in zip(TABLES, paths):
        want, got = result.columns(table), read_csv(path)
        assert list(got) == list(want)
        for c in want:
            np.testing.assert_array_equal(got[c], want[c])  # NaN == NaN here, bits equal
    assert '"status": "complete"' in paths[-1].read_text()


def test_parquet_export_round_trips(result, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed")
    paths = export(result, "parquet", tmp_path / "out")
    for table, path in zip(TABLES, paths):
        want, got = result.columns(table), pq.read_table(path)
        assert got.column_names == list(want)
        for c in want:
            np.testing.assert_array_equal(got.column(c).to_numpy(), want[c])


def test_parquet_without_pyarrow_and_overwrites_are_refused(result, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        export_mod.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyarrow" else real(name, *a),
    )
    with pytest.raises(ExportError, match=r'pyarrow: pip install "hpcpipe\[data\]"'):
        export(result, "parquet", tmp_path / "out")
    assert not list(tmp_path.iterdir())  # nothing written
    (tmp_path / "out-stages.csv").write_text("mine")
    with pytest.raises(ExportError, match="exist already"):
        export(result, "csv", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out-stages.csv"]
    assert (tmp_path / "out-stages.csv").read_text() == "mine"


def test_export_command(result, tmp_path, capsys):
    assert main(["export", str(result.path), "-o", str(tmp_path / "x")]) == 0
    assert "x-timeline.csv" in capsys.readouterr().out
    assert main(["export", str(result.path), "-o", str(tmp_path / "x")]) == 2
    assert "exist already" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.h5")]) == 2
