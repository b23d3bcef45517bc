"""A full disk or quota while a run writes its result: one line, every rank stops, nothing lost.

Before each flush, rank 0 claims the disk space the flush may need (``results.reserve``:
fallocate with KEEP_SIZE), so ENOSPC / EDQUOT shows before HDF5 writes anything of it and
the file stays as it was at its last flush: readable, status incomplete, resumable. The
setting ``inject_failure = "enospc:ITERATION"`` (or ``edquot:``) makes that claim fail at
the first flush holding ITERATION, without root; one test fills a real 1.2 MB tmpfs (root).
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from _procs import SMALL, cli_args, hpcpipe
from mpi4py import MPI

from hpcpipe.run.config import ConfigError, make_config, validate
from hpcpipe.run.results import DiskFullError, load
from hpcpipe.run.runner import run

SMALL = {**SMALL, "dim": 8, "iterations": 30, "flush_every": 5}
ARGS = cli_args(SMALL)
WAIT = 300  # s: a hang guard


def _hpcpipe(*args, cwd=None):
    return hpcpipe(*args, timeout=WAIT, cwd=cwd)


def _same_numbers(a: Path, b: Path) -> None:
    ra, rb = load(a), load(b)
    for k in ("iteration", "loss", "pipeline_time"):
        np.testing.assert_array_equal(ra.iterations[k], rb.iterations[k], err_msg=k)
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in fa["state/optimizer"]:
            np.testing.assert_array_equal(
                fa[f"state/optimizer/{k}"][()], fb[f"state/optimizer/{k}"][()]
            )


def test_injected_enospc_under_mpi_one_line_then_resume(tmp_path):
    out, ref, other = tmp_path / "r.h5", tmp_path / "ref.h5", tmp_path / "other.h5"
    other.write_bytes(b"an existing result next to it")
    stamp = other.stat().st_mtime_ns
    p = _hpcpipe("run", "--np", 2, *ARGS, "--inject-failure", "enospc:12", "--output", out)
    assert p.returncode == 2
    assert p.stderr.strip() == (
        f"hpcpipe: {out}: No space left on device (ENOSPC) while writing it: "
        "free space or choose another --output"
    ), p.stderr
    r = load(out)  # readable up to its last flush
    assert r.status == "incomplete" and r.iterations["iteration"].tolist() == list(range(1, 11))
    assert other.read_bytes() == b"an existing result next to it"
    assert other.stat().st_mtime_ns == stamp and sorted(os.listdir(tmp_path)) == [
        "other.h5",
        "r.h5",
    ]
    p = _hpcpipe("run", "--np", 2, "--resume", out)  # the injection is kept: it fails again
    assert p.returncode == 2 and "(ENOSPC)" in p.stderr and "Traceback" not in p.stderr
    p = _hpcpipe("run", "--np", 2, "--resume", out, "--inject-failure", "")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    p = _hpcpipe("run", "--np", 2, *ARGS, "--output", ref)
    assert p.returncode == 0, p.stderr
    assert load(out).status == "complete"
    _same_numbers(out, ref)


@pytest.mark.parametrize("kind, text", [("edquot", "Disk quota exceeded (EDQUOT)")])
def test_injected_edquot_in_process(kind, text, tmp_path):
    out = tmp_path / "q.h5"
    cfg = make_config({**SMALL, "inject_failure": f"{kind}:3", "output": str(out)})
    with pytest.raises(DiskFullError, match=re.escape(f"{out}: {text} while writing it: free")):
        run(cfg, MPI.COMM_SELF)
    r = load(out)
    assert r.status == "incomplete" and len(r.iterations["iteration"]) == 0


@pytest.mark.parametrize("spec", ["enospc", "enospc:x", "enospc:5:hang", "full:5", "enospc:99"])
def test_bad_disk_injections_are_refused(spec):
    with pytest.raises(ConfigError, match="inject_failure"):
        validate(make_config({**SMALL, "inject_failure": spec}), 2)


def _mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    where.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")


@pytest.mark.slow
def test_a_real_full_tmpfs_then_resume_on_a_roomy_disk(tmp_path):
    """The issue's case: a 1.2 MB tmpfs holding an existing 700 kB file."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "1200k")
    try:
        existing = disk / "existing.h5"
        existing.write_bytes(os.urandom(700_000))
        before = existing.read_bytes()
        p = _hpcpipe(
            "run",
            "--np",
            "2",
            "--depth",
            "2",
            "--dim",
            "64",
            "--iterations",
            "3000",
            "--timeline-limit",
            "3000",
            "--output",
            "big.h5",
            cwd=disk,
        )
        assert p.returncode != 0
        lines = [ln for ln in p.stderr.splitlines() if not ln.startswith("pprs: iteration")]
        assert lines == [
            "hpcpipe: big.h5: No space left on device (ENOSPC) while writing it: "
            "free space or choose another --output"
        ], p.stderr[-3000:]
        r = load(disk / "big.h5")
        assert r.status == "incomplete" and len(r.iterations["iteration"]) >= 1
        assert existing.read_bytes() == before
        assert sorted(os.listdir(disk)) == ["big.h5", "existing.h5"]
        roomy = tmp_path / "roomy"
        roomy.mkdir()
        shutil.move(disk / "big.h5", roomy / "big.h5")
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    p = _hpcpipe("run", "--np", 2, "--resume", "big.h5", "--progress", "off", cwd=roomy)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    r = load(roomy / "big.h5")
    assert r.status == "complete" and r.iterations["iteration"].tolist() == list(range(1, 3001))
