"""A full disk (or quota) on every writer besides a run's result: trace, export, plot,
analyze's report, a sweep's grid and lock files, calibrate's machine profile.

Each ends with one line naming the file, the error and the fix, a non-zero status and no
traceback; no partial output is left looking complete (``hpcpipe.run.atomic``: a
temporary file in the same folder, renamed when whole), an existing file at the target
keeps its content, and no other file is touched. The full disk is injected without root
(``HPCPIPE_INJECT_DISK_FULL``, a file-name pattern): the write fails after its content
went to the temporary file, where a real full disk would show. The real thing on a small
tmpfs (root only) is in tests/test_disk_full.py for the run and here for trace.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

from hpcpipe.run import atomic
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ENV.pop("HPCPIPE_DEBUG", None)
ENV.pop(atomic.INJECT, None)
FULL = "No space left on device"
FIX = "(free space or choose another output)"
WAIT = 300  # s: a hang guard


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    d = tmp_path_factory.mktemp("res") / "res"
    d.mkdir()
    path = d / "r.h5"
    cfg = {"problem": "l1-chain", "depth": 2, "dim": 8, "optimizer": "gd", "lr": 0.05}
    cfg |= {"iterations": 4, "progress": "off", "output": str(path), "timeline_limit": 100}
    run(make_config(cfg), MPI.COMM_SELF)
    return path


def _hpcpipe(args, full: str, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=dict(ENV, **{atomic.INJECT: full}),
        cwd=cwd,
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _one_line(p, target: Path, error: str = FULL, fix: str = FIX) -> None:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1, p.stderr
    assert str(target) in lines[0] and error in lines[0] and fix in lines[0], lines[0]


@pytest.mark.parametrize("existing", (False, True))
def test_trace(result, tmp_path, existing):
    target = tmp_path / "t.json"
    if existing:  # a trace already there keeps its content
        target.write_text("an older trace")
    (tmp_path / "keep.txt").write_text("a file next to it")
    before = _snapshot(tmp_path)
    p = _hpcpipe(["trace", result, "-o", target], "t.json")
    _one_line(p, target)
    assert _snapshot(tmp_path) == before  # no partial trace, no temporary file
    p = _hpcpipe(["trace", result, "-o", target], "")
    assert p.returncode == 0 and target.read_text().startswith("{"), p.stderr


@pytest.mark.parametrize("which", ("*-iterations.csv", "*-timeline.csv", "*-attributes.json"))
def test_export(result, tmp_path, which):
    """Whichever of its four files meets the full disk, no file of the export is left."""
    prefix = tmp_path / "x"
    (tmp_path / "keep.txt").write_text("a file next to it")
    before = _snapshot(tmp_path)
    p = _hpcpipe(["export", result, "-o", prefix], which)
    _one_line(p, tmp_path / f"x-{which[2:]}")
    assert _snapshot(tmp_path) == before


def test_export_edquot(result, tmp_path):
    p = _hpcpipe(["export", result, "-o", tmp_path / "x"], "edquot:*-stages.csv")
    fix = "(free space within your quota or choose another output)"
    _one_line(p, tmp_path / "x-stages.csv", error="Disk quota exceeded", fix=fix)
    assert list(tmp_path.iterdir()) == []


def test_plot(result, tmp_path):
    pytest.importorskip("matplotlib", reason="plot needs the plot extra (matplotlib)")
    target = tmp_path / "p.png"
    p = _hpcpipe(["plot", "timeline", result, "-o", target], "p.png")
    _one_line(p, target)
    assert list(tmp_path.iterdir()) == []


def test_analyze_report(result, tmp_path):
    """The report (and each figure) is whole or absent; the results are not touched."""
    out = tmp_path / "rep"
    before = _snapshot(result.parent)
    p = _hpcpipe(["analyze", result.parent, "-o", out], "report.md")
    _one_line(p, out / "report.md")
    assert not (out / "report.md").exists()
    assert not [f for f in out.iterdir() if ".tmp" in f.name]
    assert _snapshot(result.parent) == before
    if any(out.glob("*.png")):  # a figure written before the report is a whole PNG
        assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in out.glob("*.png"))


SWEEP = """
[sweep]
name = "full"
out = "{out}"
ranks = 1
[base]
problem = "l1-chain"
depth = 2
dim = 8
iterations = 3
progress = "off"
[grid]
seed = [0, 1]
"""


@pytest.mark.parametrize("name", ("grid.json", ".hpcpipe-sweep.lock"))
def test_sweep_grid_and_lock(tmp_path, name):
    out = tmp_path / "out"
    toml = tmp_path / "s.toml"
    toml.write_text(SWEEP.format(out=out))
    before = _snapshot(tmp_path)
    p = _hpcpipe(["sweep", toml], name)
    _one_line(p, out / name)
    assert not any(out.glob("*.h5")) and not (out / "grid.json").exists()  # no point ran
    assert not [f for f in out.iterdir() if ".tmp" in f.name]
    assert {k: v for k, v in _snapshot(tmp_path).items() if not k.startswith("out/")} == before


def test_calibrate_profile(tmp_path):
    out = tmp_path / "m.toml"
    args = ["calibrate", "--np", "2", "--output", out, "--wait", "sleep", "--kinds"]
    args += ["orthogonal", "--width", "16", "--layer-time", "0.001", "--budget", "0.2"]
    args += ["--sizes", "8,4096"]
    p = _hpcpipe(args, "m.toml")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and "MPI_Abort" not in ln]
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1 and str(out) in lines[0] and FULL in lines[0] and FIX in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_the_injection_names_only_matching_files(tmp_path):
    """The hook's patterns: a name that matches no pattern is written."""
    os.environ[atomic.INJECT] = "*.png, edquot:report.md"
    try:
        assert atomic.injected(tmp_path / "a.png") == 28
        assert atomic.injected(tmp_path / "report.md") == 122
        assert atomic.injected(tmp_path / "a.json") is None
        atomic.write_text(tmp_path / "a.json", "whole")
        with pytest.raises(OSError) as e:
            atomic.write_text(tmp_path / "report.md", "lost")
        assert e.value.filename == str(tmp_path / "report.md")
    finally:
        del os.environ[atomic.INJECT]
    assert sorted(os.listdir(tmp_path)) == ["a.json"]


TMPFS_KB = 64


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_real_full_tmpfs_for_a_trace(result, tmp_path):
    """A trace onto a full 64 KiB tmpfs: one line, nothing left on it, the note there
    before kept."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_KB}k", "tmpfs", str(mnt)],
                   check=True)  # fmt: skip
    try:
        (mnt / "note.txt").write_text("kept")
        with open(mnt / "filler", "wb", buffering=0) as fh:  # the disk full: every block taken
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == 28, e
        target = mnt / "t.json"
        p = _hpcpipe(["trace", result, "-o", target], "")
        _one_line(p, target)
        assert sorted(os.listdir(mnt)) == ["filler", "note.txt"]
        assert (mnt / "note.txt").read_text() == "kept"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
