"""Checksums: every dataset carries HDF5's Fletcher-32 filter; a flipped byte is reported.

One byte inside a stored chunk (found with ``get_chunk_info``) of a dataset of each group
(iterations, timeline, state) is flipped. ``load``, ``hpcpipe export`` and ``hpcpipe trace``
must then report the file as damaged, naming the dataset, with exit 2 and no traceback. The
same flip in a file without checksums goes through unnoticed (what the checksums are for).
Files written before the checksums (tests/data/no-checksums.h5.gz, an incomplete run made
by the version before them) still read and resume, flagged "no checksums".
"""

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.cli.main import main
from hpcpipe.run.config import make_config
from hpcpipe.run.results import NO_CHECKSUMS, ResultsError, load, read_state
from hpcpipe.run.runner import run

HERE = Path(__file__).parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
SMALL = dict(
    problem="l1-chain",
    depth=2,
    dim=4,
    optimizer="pprs",
    samples=2,
    gamma=0.05,
    lr=0.05,
    iterations=12,
    flush_every=3,
    timeline_limit=4,
    clock="model",
    progress="off",
)
DATASETS = ("/iterations/loss", "/timeline/start", "/state/optimizer/theta")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("sum") / "r.h5"
    run(make_config({**SMALL, "output": str(path)}), MPI.COMM_SELF)
    return path


def _flip(path: Path, name: str) -> tuple[float, float]:
    """Flip one byte in the middle of the first stored chunk of ``name`` (the data, not the
    checksum after it); the dataset's first value before, and as read without a check."""
    with h5py.File(path, "r") as f:
        d = f[name]
        info = d.id.get_chunk_info(0)
        before = float(d[0])
        data = info.size - (4 if d.fletcher32 else 0)
    at = info.byte_offset + min(data // 2, 3)  # inside the first value's 8 bytes
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x10]))
    return before, at


def test_every_dataset_is_checksummed(written):
    names = []
    with h5py.File(written, "r") as f:
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        unsummed = [n for n in names if not f[n].fletcher32]
    assert len(names) > 20 and unsummed == []
    assert load(written).checksums


@pytest.mark.parametrize("name", DATASETS)
def test_a_flipped_byte_is_reported_naming_the_dataset(name, written, tmp_path):
    bad = tmp_path / "bad.h5"
    shutil.copy(written, bad)
    _flip(bad, name)
    with pytest.raises(ResultsError, match=f"damaged result: dataset {name} fails its"):
        load(bad)
    for cmd in (["export", bad, "-o", tmp_path / "x"], ["trace", bad, "-o", tmp_path / "t.json"]):
        p = subprocess.run(
            [sys.executable, "-m", "hpcpipe", *map(str, cmd)],
            capture_output=True,
            text=True,
            timeout=120,
            env=ENV,
        )
        assert p.returncode == 2, (cmd, p.stderr)
        assert f"dataset {name} fails its Fletcher-32 checksum" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("x-*")) and not (tmp_path / "t.json").exists()


def test_without_checksums_the_same_flip_goes_unnoticed(tmp_path):
    """The planted fault is real: in a file without checksums it changes a value silently."""
    path = tmp_path / "old.h5"
    path.write_bytes(gzip.decompress((HERE / "data" / "no-checksums.h5.gz").read_bytes()))
    before, _ = _flip(path, "/iterations/loss")
    r = load(path)
    assert not r.checksums and r.iterations["loss"][0] != before


def test_a_file_from_before_checksums_reads_flagged_and_resumes(tmp_path, capsys):
    old = tmp_path / "old.h5"
    old.write_bytes(gzip.decompress((HERE / "data" / "no-checksums.h5.gz").read_bytes()))
    r = load(old)
    assert r.status == "incomplete" and not r.checksums
    assert r.iterations["iteration"].tolist() == list(range(1, 9))
    assert main(["export", str(old), "-o", str(tmp_path / "e")]) == 0
    assert f"note: {old}: {NO_CHECKSUMS}" in capsys.readouterr().err
    assert read_state(old).scalars[0] == 9
    stored = r.iterations["loss"].copy()
    assert main(["run", "--resume", str(old)]) == 0
    done = load(old)
    ref = tmp_path / "ref.h5"
    run(make_config({**SMALL, "output": str(ref)}), MPI.COMM_SELF)
    assert done.status == "complete" and not done.checksums  # its old datasets stay as they were
    np.testing.assert_array_equal(done.iterations["loss"][:8], stored)  # bitwise untouched
    # the stored file was written on another machine, and numpy's summation order (so the
    # last bits) depends on the CPU: 1.5e-15 relative apart on an AVX-512 machine. Bitwise
    # resumes on one machine are tested in test_crash_saves.py
    np.testing.assert_allclose(done.iterations["loss"], load(ref).iterations["loss"], rtol=1e-12)
    with h5py.File(old, "r") as f, h5py.File(ref, "r") as g:
        assert f["state/commit"].fletcher32  # what the resume added carries checksums
        for k in g["state/optimizer"]:
            np.testing.assert_allclose(
                f[f"state/optimizer/{k}"][()], g[f"state/optimizer/{k}"][()], rtol=1e-12
            )
