"""HDF5 results: schema, flushing, survival of SIGKILL / SIGTERM, trace and plots."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.run.config import ConfigError, make_config
from hpcpipe.run.results import ResultsError, load, load_dir
from hpcpipe.run.runner import COLUMNS, run
from hpcpipe.run.trace import chrome_trace, gantt_png, timeline_rows

SELF = MPI.COMM_SELF
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def small(tmp_path, **kw):
    base = dict(
        problem="l1-chain",
        depth=3,
        dim=8,
        optimizer="pprs",
        samples=3,
        gamma=0.05,
        lr=0.05,
        iterations=25,
        output=str(tmp_path / "r.h5"),
        progress="off",
        flush_every=4,
        timeline_limit=5,
        timeline_every=10,
    )
    return make_config({**base, **kw})


def test_result_file_schema_and_content(tmp_path):
    cfg = small(tmp_path)
    res = run(cfg, SELF)
    r = load(cfg.output)
    assert r.status == "complete"
    assert int(r.attrs["schema_version"]) == 3
    prob = json.loads(r.attrs["problem"])
    assert prob["name"] == prob["entry"] == "l1-chain" and prob["depth"] == 3
    assert prob["module"] == "hpcpipe.problems.chains"
    assert json.loads(r.attrs["method"])["name"] == "pprs" and r.attrs["executor"] == "mpi"
    # the timeout is recorded as used: the automatic one (-1) resolves to off on one rank
    assert cfg.timeout == -1 and r.config["timeout"] == 0.0
    assert r.config == {**json.loads(cfg.to_json()), "timeout": 0.0}
    assert r.attrs["config.samples"] == 3 and r.attrs["n_ranks"] == 1
    for key in ("hpcpipe", "numpy", "mpi4py", "h5py", "mpi"):
        assert key in json.loads(r.attrs["versions"])
    assert r.attrs["start_time"] and r.attrs["end_time"] and r.attrs["command"]
    assert set(r.iterations) == set(COLUMNS)
    np.testing.assert_array_equal(np.column_stack([r.iterations[c] for c in COLUMNS]), res.table)
    # timeline: all actions of iterations 1..5, then of 10 and 20
    its = sorted(set(r.timeline["iteration"].tolist()))
    assert its == [1, 2, 3, 4, 5, 10, 20]
    assert len(r.timeline["end"]) == 7 * 2 * 3  # 2 actions x 3 items per iteration, 1 stage
    assert np.all(r.timeline["end"] >= r.timeline["start"])
    assert np.all(r.timeline["start"] >= r.timeline["wait"])
    assert r.stages["actions"].tolist() == [25 * 6]
    # model clock, tau = 1 per layer: busy = 25 iterations x 3 items x (3 + 3) layers
    assert r.stages["busy"][0] == pytest.approx(25 * 3 * 6)
    df = r.frame()
    assert list(df["iteration"]) == list(range(1, 26))


def test_never_overwrites(tmp_path):
    cfg = small(tmp_path)
    run(cfg, SELF)
    with pytest.raises(ConfigError, match="exists already"):
        run(cfg, SELF)


def test_h5dump_lists_the_documented_schema(tmp_path):
    h5dump = shutil.which("h5dump")
    if h5dump is None:
        pytest.skip("h5dump not installed (apt-get install hdf5-tools); .ci/run installs it")
    cfg = small(tmp_path)
    run(cfg, SELF)
    out = subprocess.run([h5dump, "-H", cfg.output], capture_output=True, text=True).stdout
    for name in (
        "schema_version",
        "status",
        "config",
        "versions",
        'GROUP "iterations"',
        'DATASET "loss"',
        'GROUP "timeline"',
        'DATASET "kind"',
        'GROUP "stages"',
        'DATASET "busy"',
    ):
        assert name in out, name


def _wait_for_rows(path, n, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        if os.path.exists(path):
            try:
                if len(load(path).iterations["iteration"]) >= n:
                    return
            except ResultsError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"{path} never reached {n} rows")


def _slow_run(tmp_path):
    out = str(tmp_path / "killed.h5")
    cmd = [
        sys.executable,
        "-m",
        "hpcpipe",
        "run",
        "--np",
        "2",
        "--problem",
        "l1-chain",
        "--depth",
        "2",
        "--dim",
        "8",
        "--optimizer",
        "gd",
        "--lr",
        "0.01",
        "--iterations",
        "100000",
        "--layer_time",
        "0.002",
        "--flush_every",
        "5",
        "--output",
        out,
        "--progress",
        "off",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, start_new_session=True
    )
    return out, proc


def test_sigkill_leaves_readable_incomplete_file(tmp_path):
    out, proc = _slow_run(tmp_path)
    try:
        _wait_for_rows(out, 10, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    r = load(out)
    assert r.status == "incomplete"
    n = len(r.iterations["iteration"])
    assert n >= 10 and n % 5 == 0  # every flushed block of 5 iterations is there
    assert r.iterations["iteration"].tolist() == list(range(1, n + 1))
    assert np.all(np.isfinite(r.iterations["loss"]))


def test_sigterm_flushes_and_marks_incomplete(tmp_path):
    out, proc = _slow_run(tmp_path)
    _wait_for_rows(out, 10, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    r = load(out)
    assert r.status == "incomplete"
    n = len(r.iterations["iteration"])
    assert n >= 10
    assert r.stages["actions"].sum() > 0  # the end-of-run summary was written


def test_truncated_and_foreign_files(tmp_path):
    cfg = small(tmp_path)
    run(cfg, SELF)
    data = open(cfg.output, "rb").read()
    bad = tmp_path / "trunc.h5"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(ResultsError, match="trunc.h5"):
        load(bad)
    (tmp_path / "foreign.h5").write_bytes(b"not hdf5 at all")
    warnings = []
    good = load_dir(tmp_path, warn=warnings.append)
    assert [g.path.name for g in good] == ["r.h5"]
    assert len(warnings) == 2 and any("foreign.h5" in w for w in warnings)


def test_chrome_trace_structure_and_gantt_png(tmp_path):
    cfg = small(tmp_path)
    run(cfg, SELF)
    r = load(cfg.output)
    obj = chrome_trace(r.timeline, "model")
    json.dumps(obj)  # serialisable
    evs = obj["traceEvents"]
    meta = [e for e in evs if e["ph"] == "M"]
    xs = [e for e in evs if e["ph"] == "X"]
    assert {e["name"] for e in meta} == {"process_name", "process_sort_index", "thread_name"}
    acts = [e for e in xs if e["cat"] in ("F", "B")]
    assert len(acts) == len(r.timeline["end"])
    for e in xs:
        assert set(e) >= {"name", "ph", "ts", "dur", "pid", "tid", "args"}
        assert e["dur"] >= 0 and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    png = tmp_path / "t.png"
    gantt_png(timeline_rows(r.timeline, 20), png, "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    p = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "trace", cfg.output, "-o", str(tmp_path / "t.json")],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert p.returncode == 0 and json.loads((tmp_path / "t.json").read_text())["traceEvents"]


class _Stop(Exception):
    pass


def _interrupted(cfg, at: int) -> None:
    """Run cfg in process and fail at iteration ``at``: the file stays incomplete."""

    def fail(row):
        if row.iteration == at:
            raise _Stop

    with pytest.raises(_Stop):
        run(cfg, SELF, on_iteration=fail)


@pytest.mark.parametrize("schema", [1, 2, 3])
def test_exception_leaves_a_resumable_file_and_resume_is_bitwise(tmp_path, schema):
    """An exception inside the loop closes the file (status incomplete, last flush kept);
    resuming it, also from the schema-1 layout (theta, prev) and the schema-2 layout (no
    backup, no commit marker), ends bitwise where an uninterrupted run ends (AGD on
    max-chain: two arrays, a scalar, a regulariser), and the continued file is schema 3."""
    kw = dict(problem="max-chain", optimizer="agd", samples=1, gamma=0.0, lr=0.05)
    full = run(small(tmp_path, **kw, output=str(tmp_path / "full.h5")), SELF)
    cfg = small(tmp_path, **kw, output=str(tmp_path / "part.h5"))
    _interrupted(cfg, 10)
    r = load(cfg.output)
    assert r.status == "incomplete" and r.iterations["iteration"].tolist() == list(range(1, 9))
    if schema == 1:  # the layout files written before named optimizer state had
        with h5py.File(cfg.output, "r+") as f:
            st = f["state"]
            st["theta"], st["prev"] = st["optimizer/theta"][()], st["optimizer/prev"][()]
            assert st["optimizer_scalars"][()].tolist() == [9.0] == [st["scalars"][0]]
            del st["optimizer"], st["optimizer_scalars"]
            f.attrs["schema_version"] = 1
    if schema in (1, 2):  # the layouts written before crash-consistent saves
        with h5py.File(cfg.output, "r+") as f:
            del f["state/backup"], f["state/commit"]
            f.attrs["schema_version"] = schema
        assert int(load(cfg.output).attrs["schema_version"]) == schema
    res = run(cfg, SELF, resume=cfg.output)
    assert res.status == "complete"
    np.testing.assert_array_equal(res.theta, full.theta)
    np.testing.assert_array_equal(load(cfg.output).iterations["loss"], full.column("loss"))
    with h5py.File(cfg.output, "r") as f:
        assert f.attrs["schema_version"] == 3 and {"backup", "commit"} <= set(f["state"])
