"""Benchmark commands run on tiny sizes and print their header (no timing is asserted)."""

import json
import os
import subprocess
import sys

import pytest

from hpcpipe.bench.common import RECORDS_ENV, paired, ratios
from hpcpipe.bench.simulate import bench_simulate


@pytest.fixture(autouse=True)
def records(tmp_path, monkeypatch):
    """Every case writes its JSON record: here into the test's own folder."""
    folder = tmp_path / "records"
    monkeypatch.setenv(RECORDS_ENV, str(folder))
    return folder


def env():
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def bench(*args):
    p = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("command: hpcpipe bench " + args[0]), p.stdout
    assert "MPICH" in p.stdout or "Open MPI" in p.stdout, p.stdout
    return p.stdout


def test_transport_reports_every_raw_path_and_both_ratios():
    out = bench("transport", "--max-bytes", "64", "--iters", "5", "--repeats", "1")
    assert "lat ratio" in out and "bw ratio" in out and "sanity: ok" in out
    assert len([line for line in out.splitlines() if line.strip().startswith(("8 ", "64 "))]) == 2


def test_dense_checks_the_bare_loop_gradient():
    out = bench("dense", "--width", "8", "--mb", "1,2", "--micro", "2", "--repeats", "1")
    assert "step/bare" in out and "gradients equal" in out


def test_pipeline_at_more_ranks_than_cores():
    out = bench(
        "pipeline", "--np", "3", "--layer-time", "0.0002", "--samples", "2", "--repeats", "1"
    )
    assert "efficiency" in out and "sanity: ok" in out


def test_pipeline_refuses_fewer_layers_than_ranks():
    p = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "bench", "pipeline", "--np", "2", "--depth", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(),
    )
    assert p.returncode == 2 and "--depth must be >=" in p.stdout + p.stderr


def test_simulate_case_in_process(capsys):
    assert bench_simulate(1, stages=4, items=4, big=8, big_repeats=1, query=(4, 10)) == 0
    out = capsys.readouterr().out
    assert "M actions/s" in out and "gpipe" in out and "fill-drain" in out


def test_paired_alternates_the_order():
    seen = []
    times = paired({"a": lambda: seen.append("a"), "b": lambda: seen.append("b")}, 3, warmup=1)
    assert seen == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(times["a"]) == len(times["b"]) == 3
    assert ratios([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == pytest.approx(3.0)


def test_study_case_times_numerics_and_timing_of_the_simulated_executor(capsys):
    from hpcpipe.bench.study import bench_study

    assert bench_study([4, 8], 4, 2, 1) == 0
    out = capsys.readouterr().out
    assert "timing (ms)" in out and "numerics fused (ms)" in out and "sanity: ok" in out


def test_transport_writes_a_dated_record_of_its_printed_figures(records):
    """The record holds the command, machine, versions, load and the printed figures."""
    out = bench("transport", "--max-bytes", "64", "--iters", "5", "--repeats", "1")
    (path,) = records.glob("transport-*.json")
    assert f"record: {path}" in out
    rec = json.loads(path.read_text())
    assert rec["case"] == "transport" and rec["sane"] is True
    assert rec["command"].startswith("hpcpipe bench transport --max-bytes 64")
    assert rec["ranks"] == "2 ranks" and rec["versions"]["MPI"] in out
    assert rec["machine"]["cores"] >= 1 and len(rec["load_start"]) == 3
    assert rec["date"].endswith("Z") and rec["wall_s"] > 0
    printed = [line.split() for line in out.splitlines() if line.split()[0].isdigit()]
    assert [r[0] for r in rec["rows"]] == [int(p[0]) for p in printed] == [8, 16, 32, 64]
    col = rec["headings"].index("lat ratio")
    assert [float(p[col]) for p in printed] == pytest.approx([r[col] for r in rec["rows"]], 1e-3)


def test_records_never_overwrite_and_name_the_variable_when_unwritable(
    records, tmp_path, monkeypatch, capsys
):
    from hpcpipe.bench.common import write_record

    paths = [write_record("unit", ["x (s)"], [[x]], sane=True) for x in (1.5, 2.5, 3.5)]
    assert len(set(paths)) == 3 and sorted(records.glob("unit-*.json")) == sorted(paths)
    assert [json.loads(p.read_text())["rows"] for p in paths] == [[[1.5]], [[2.5]], [[3.5]]]
    blocker = tmp_path / "a-file"
    blocker.write_text("keep")
    monkeypatch.setenv(RECORDS_ENV, str(blocker))
    assert write_record("unit", ["x"], [[1]], sane=True) is False
    err = capsys.readouterr().err
    assert RECORDS_ENV in err and err.count("\n") == 1 and blocker.read_text() == "keep"
    monkeypatch.setenv(RECORDS_ENV, "off")
    assert write_record("unit", ["x"], [[1]], sane=True) is None
