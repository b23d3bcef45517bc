"""A writer killed while HDF5 grows the file: shorter than its end-of-file address, resumed.

HDF5 records a larger end-of-file address in the superblock before it writes the file's
new tail; a kill -9 in between leaves a file shorter than that address. Readers that do
not resume (load, export, trace) call it truncated. A resume (``run --resume``, a sweep
resuming a point) lengthens it to that address, as ``h5clear --increment`` does, keeps
that only if the file then loads as an incomplete result (Fletcher-32 checksums, the
committed state), says so in one line, and continues to the uninterrupted run's numbers.
A file cut by a copy or by hand is left byte for byte as it was and still refused.

The grown address is planted by rewriting the superblock's end-of-file field (and its
checksum) of a file whose writer was killed, which is what the kill leaves behind.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from _procs import ENV, SMALL, cli_args, hpcpipe
from mpi4py import MPI

from hpcpipe.cli.commands import run as run_command
from hpcpipe.errors import ConfigError
from hpcpipe.run import results, superblock
from hpcpipe.run.config import make_config
from hpcpipe.run.results import ResultsError, load
from hpcpipe.run.runner import run

ARGS = cli_args(SMALL)
KILLER = """
import os, signal, sys
from hpcpipe.run import results
seen = []
def hook(p):
    if p == "state-committed":
        seen.append(p)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
results.SAVE_HOOK = hook
from hpcpipe.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
SWEEP = """
[sweep]
name = "grown"
out = "{out}"
ranks = 1
[base]
{base}
[grid]
seed = [0]
"""
WAIT = 120  # s: a hang guard for every process


def _hpcpipe(*args):
    return hpcpipe(*args, timeout=WAIT)


def _killed(tmp_path: Path, out: Path, extra: tuple = ()) -> None:
    """A run whose writer is killed (SIGKILL) right after its 2nd save: left open."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    cmd = [sys.executable, str(script), "run", *ARGS, *extra, "--output", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT, env=ENV)
    assert p.returncode == -9, p.stderr
    assert superblock.left_open(superblock.read(out))


def _grow_eof(path: Path, extra: int = 4096) -> int:
    """Move the superblock's end-of-file address ``extra`` bytes past the file's end."""
    sb = superblock.read(path)
    assert sb.version in (2, 3)
    o = sb.offset_size
    with open(path, "r+b") as fh:
        head = bytearray(fh.read(sb.checksum_at))
        eof = os.path.getsize(path) + extra
        head[12 + 2 * o : 12 + 3 * o] = eof.to_bytes(o, "little")
        fh.seek(0)
        fh.write(bytes(head) + superblock.lookup3(bytes(head)).to_bytes(4, "little"))
    return eof


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _final(path: Path) -> dict[str, np.ndarray]:
    r = load(path)
    assert r.status == "complete", (path, r.status)
    out = {k: r.iterations[k] for k in ("iteration", "loss", "pipeline_time")}
    with h5py.File(path, "r") as f:
        for k in f["state/optimizer"]:
            out[f"state/{k}"] = f[f"state/optimizer/{k}"][()]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.h5"
    run(make_config({**SMALL, "output": str(path)}), MPI.COMM_SELF)
    return _final(path)


def _same(path: Path, reference: dict) -> None:
    got = _final(path)
    assert got.keys() == reference.keys()
    for k, v in reference.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_readers_call_it_truncated_and_resume_repairs_it(tmp_path, reference):
    out = tmp_path / "cut.h5"
    _killed(tmp_path, out)
    size = out.stat().st_size
    eof = _grow_eof(out)
    with pytest.raises(ResultsError, match=rf"truncated \({size} bytes, its superblock says"):
        load(out)
    made = (tmp_path / "x.csv", tmp_path / "x.json")
    for cmd in (("export", out, "-o", made[0]), ("trace", out, "-o", made[1])):
        p = _hpcpipe(*cmd)
        assert p.returncode == 2 and "truncated" in p.stderr and "Traceback" not in p.stderr
        assert out.stat().st_size == size  # readers change nothing
    assert not any(m.exists() for m in made)
    p = _hpcpipe("run", "--resume", out)
    assert p.returncode == 0, p.stderr
    said = [ln for ln in p.stderr.splitlines() if "as h5clear --increment does" in ln]
    assert len(said) == 1 and f"{size} of the {eof} bytes" in said[0], p.stderr
    assert "Traceback" not in p.stderr
    _same(out, reference)


def test_without_the_repair_the_resume_is_refused(tmp_path, monkeypatch):
    """The control: the same file, with the repair switched off, cannot be resumed."""
    out = tmp_path / "cut.h5"
    _killed(tmp_path, out)
    _grow_eof(out)
    monkeypatch.setattr(results, "recover_truncated", lambda path, log=None: False)
    with pytest.raises(ConfigError, match="truncated"):
        run_command.resume_config(str(out), [])


def test_a_file_cut_by_hand_is_left_as_it_is(tmp_path):
    """Cut inside its data, a killed writer's file cannot load even when lengthened: the
    resume refuses it as truncated and the file keeps its bytes and size."""
    out = tmp_path / "cut.h5"
    _killed(tmp_path, out)
    out.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    before = _digest(out)
    p = _hpcpipe("run", "--resume", out)
    assert p.returncode == 2 and "truncated" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert _digest(out) == before


def test_a_closed_file_cut_by_a_copy_is_not_lengthened(tmp_path):
    """A file whose writer closed it (no open flag) and that a copy cut short: refused."""
    done = tmp_path / "done.h5"
    run(make_config({**SMALL, "output": str(done)}), MPI.COMM_SELF)
    cut = tmp_path / "copy.h5"
    cut.write_bytes(done.read_bytes()[:-100])
    before = _digest(cut)
    assert results.recover_truncated(cut) is False
    p = _hpcpipe("run", "--resume", cut)
    assert p.returncode == 2 and "truncated" in p.stderr
    assert _digest(cut) == before


def test_the_sweep_resumes_such_a_point(tmp_path, reference):
    out = tmp_path / "sweep"
    base = "\n".join(
        f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in SMALL.items()
    )
    toml = tmp_path / "grown.toml"
    toml.write_text(SWEEP.format(out=out, base=base.replace("'", '"')))
    point = out / "0000-seed=0.h5"
    out.mkdir()
    _killed(tmp_path, point, ("--seed", "0"))
    size = point.stat().st_size
    _grow_eof(point)
    p = _hpcpipe("sweep", toml, "--list")
    assert p.returncode == 0 and "unreadable" in p.stdout and "truncated" in p.stdout
    assert point.stat().st_size == size  # --list changes nothing
    p = _hpcpipe("sweep", toml)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    said = [ln for ln in p.stdout.splitlines() if "as h5clear --increment does" in ln]
    assert len(said) == 1 and said[0].startswith("[grown] point 0 seed=0: recovered"), p.stdout
    assert "1 resumed" in p.stdout, p.stdout
    _same(point, reference)
