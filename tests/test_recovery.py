"""Nothing lost: resume after kill -9 of a rank, sweeps rerun after a killed point, launcher
death, locks against two writers, overrides on resume, and late copies of SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.cli.main import main
from hpcpipe.run import superblock
from hpcpipe.run.config import make_config
from hpcpipe.run.results import ResultsError, Writer, _lock, load
from hpcpipe.run.runner import COLUMNS, run
from hpcpipe.studies.sweep import SweepLock, load_sweep

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
SMALL = dict(
    problem="l1-chain",
    depth=2,
    dim=8,
    optimizer="pprs",
    samples=2,
    gamma=0.05,
    lr=0.05,
    progress="off",
)
RUN = ["run", *(w for k, v in SMALL.items() for w in (f"--{k}", str(v)))]


def _ranks_of(marker: str) -> dict[int, int]:
    """{MPI rank: pid} of the processes whose command line holds ``marker``."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker not in cmd or f"{os.getpid()}" == d.name:
            continue
        for e in env:
            if e.startswith(b"PMI_RANK="):
                out[int(e[9:])] = int(d.name)
    return out


def _wait_ranks(marker: str, n: int, proc, timeout: float = 120) -> dict[int, int]:
    """{MPI rank: pid} once all n ranks of the run are up (``timeout``: a hang guard)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        ranks = _ranks_of(marker)
        if set(ranks) == set(range(n)):
            return ranks
        time.sleep(0.1)
    raise AssertionError(f"the {n} ranks of {marker} never showed up")


def _wait_rows(path: Path, n: int, proc, timeout: float = 120) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        try:
            if path.exists() and len(load(path).iterations["iteration"]) >= n:
                return
        except ResultsError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{path} never reached {n} rows")


def _hpcpipe(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def _start(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "hpcpipe", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,
    )


def test_kill_9_of_a_rank_then_resume_equals_uninterrupted(tmp_path):
    common = [*RUN, "--np", "2", "--iterations", "40", "--layer_time", "0.01", "--flush_every", 5]
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    p = _hpcpipe(*common, "--output", full)
    assert p.returncode == 0, p.stderr
    proc = _start(*common, "--output", part)
    ranks = _wait_ranks(str(part), 2, proc)  # found first: a /proc scan takes time
    _wait_rows(part, 10, proc)
    os.kill(ranks[1], signal.SIGKILL)  # a rank, not the launcher; at once after the rows
    proc.communicate(timeout=120)  # a hang guard
    assert proc.returncode != 0
    assert superblock.read(part).flags != 0  # rank 0 was brought down without closing it
    r = load(part)
    assert r.status == "incomplete" and 10 <= len(r.iterations["iteration"]) < 40
    p = _hpcpipe("run", "--np", 2, "--resume", part)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert f"recovered {part}: its writer stopped without closing it" in p.stderr
    assert "as h5clear -s does" in p.stderr
    a, b = load(full), load(part)
    assert b.status == "complete" and b.iterations["iteration"].tolist() == list(range(1, 41))
    with h5py.File(full) as fa, h5py.File(part) as fb:
        for k in fa["state/optimizer"]:  # bitwise
            np.testing.assert_array_equal(
                fa[f"state/optimizer/{k}"][()], fb[f"state/optimizer/{k}"][()]
            )
    np.testing.assert_array_equal(a.iterations["loss"], b.iterations["loss"])


SWEEP = """
[sweep]
name = "k"
out = "{out}"
ranks = 2
[base]
problem = "l1-chain"
depth = 2
dim = 8
optimizer = "gd"
lr = 0.01
iterations = 40
layer_time = 0.003
flush_every = 5
progress = "off"
[grid]
seed = [0, 1, 2]
"""


def test_sweep_rerun_after_a_killed_point_finishes_every_point(tmp_path):
    sweep = tmp_path / "k.toml"
    sweep.write_text(SWEEP.format(out=tmp_path / "res"))
    pts = load_sweep(sweep).points
    proc = _start("sweep", sweep)
    _wait_rows(pts[1].path, 10, proc)  # point 0 done, point 1 under way
    ranks = _ranks_of(str(sweep))
    os.kill(ranks[1], signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert load(pts[0].path).status == "complete" and not pts[2].path.exists()
    assert load(pts[1].path).status == "incomplete"
    p = _hpcpipe("sweep", sweep)
    assert p.returncode == 0, p.stderr
    assert "1 ran, 1 resumed, 1 skipped; 3/3 points finished" in p.stdout, p.stdout
    assert f"recovered {pts[1].path}" in p.stderr
    assert [load(pt.path).status for pt in pts] == ["complete"] * 3
    assert load(pts[1].path).iterations["iteration"].tolist() == list(range(1, 41))


def test_killing_the_launcher_stops_mpiexec_and_the_ranks(tmp_path):
    out = tmp_path / "orphan.h5"
    proc = _start(*RUN, "--np", 2, "--iterations", 100000, "--layer_time", 0.003, "--output", out)
    _wait_rows(out, 5, proc)
    assert len(_ranks_of(str(out))) == 2
    proc.kill()  # SIGKILL: no handler runs in the launcher
    proc.communicate(timeout=30)
    t0 = time.time()
    while _ranks_of(str(out)) and time.time() - t0 < 30:
        time.sleep(0.1)
    assert not _ranks_of(str(out)), "ranks still running without their launcher"
    left = time.time() - t0
    r = load(out)  # the ranks stopped as on SIGTERM: flushed, closed, incomplete
    assert r.status == "incomplete" and r.stages["actions"].sum() > 0
    assert superblock.read(out).flags == 0
    print(f"ranks gone {left:.2f} s after the launcher was killed")


def _incomplete(path: Path, stop_at: int = 6, **kw) -> Path:
    cfg = make_config({**SMALL, "iterations": 20, "flush_every": 3, "output": str(path), **kw})

    def hook(row):
        if row[0] == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)

    run(cfg, MPI.COMM_SELF, on_iteration=hook)
    assert load(path).status == "incomplete"
    return path


def test_resume_refuses_overrides_and_checks_before_launch(tmp_path, capsys):
    f = _incomplete(tmp_path / "r.h5")
    before = f.read_bytes()
    cases = [
        (["--lr", "0.5"], "--lr 0.5 cannot be changed on resume: the file records lr = 0.05"),
        (["--output", tmp_path / "other.h5"], "--output"),
        (["--samples", "4"], "samples = 2"),
        (["--config", tmp_path / "x.toml"], "--config cannot be combined"),
        (["--no-output"], "--no-output cannot be combined"),
        (["--np", "3"], "was written by 1 ranks; resume it on 1 (--np 1), not 3"),
        (["--np", "-1"], "--np"),
        (["--lr", "abc"], "lr: expected a number"),
    ]
    for extra, message in cases:
        try:
            rc = main(["run", "--resume", str(f), *map(str, extra)])
        except SystemExit as e:  # argparse's own refusal (--np)
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and message in err and "Traceback" not in err, (extra, err)
    assert f.read_bytes() == before and not (tmp_path / "other.h5").exists()
    fd = _lock(f)  # a live writer holds it
    try:
        assert main(["run", "--resume", str(f)]) == 2
        assert "is being written by a running process" in capsys.readouterr().err
    finally:
        os.close(fd)
    # unchanged values and settings that do not change the numbers: accepted and recorded
    assert main(["run", "--resume", str(f), "--lr", "0.05", "--progress", "lines"]) == 0
    r = load(f)
    assert r.status == "complete" and json.loads(r.attrs["resume_overrides"]) == [
        {"resume": 1, "progress": "lines"}
    ]


def test_two_sweeps_on_one_folder_and_two_writers_on_one_file(tmp_path, capsys):
    sweep = tmp_path / "k.toml"
    sweep.write_text(SWEEP.format(out=tmp_path / "res"))
    lock = SweepLock(tmp_path / "res", shared=False)  # another sweep runs there
    try:
        for extra in ([], ["--point", "1"]):
            rc = main(["sweep", str(sweep), *extra])
            err = capsys.readouterr().err
            assert rc == 2 and "is in use by another sweep" in err and str(tmp_path / "res") in err
    finally:
        lock.release()
    a = SweepLock(tmp_path / "res", shared=True)  # array tasks of one sweep share it
    SweepLock(tmp_path / "res", shared=True).release()
    a.release()
    path = tmp_path / "w.h5"
    w = Writer(path, {"config": "{}"}, COLUMNS, 1)
    with pytest.raises(ResultsError, match="results are never overwritten"):
        Writer(path, {"config": "{}"}, COLUMNS, 1)
    w.close("complete")
    assert load(path).status == "complete"


def test_late_sigterm_copies_cannot_kill_the_final_write(tmp_path, monkeypatch):
    """mpiexec passes on each SIGTERM it gets (the launcher forwards one more): a copy that
    arrives while the run writes its summary must not reach the default handler. This was
    the cause of test_sigterm_flushes_and_marks_incomplete's failure under load."""
    from hpcpipe.pipeline.recording import Recorder

    reached = []
    old = signal.signal(signal.SIGTERM, lambda s, f: reached.append(s))
    summary = Recorder.stage_summary

    def late_copy(self, comm):
        os.kill(os.getpid(), signal.SIGTERM)  # the forwarded copy, arriving late
        return summary(self, comm)

    monkeypatch.setattr(Recorder, "stage_summary", late_copy)
    try:
        path = _incomplete(tmp_path / "late.h5", stop_at=5)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert reached == []  # absorbed by the run, not by the process's own handler
    r = load(path)
    assert r.status == "incomplete" and r.stages["actions"].sum() > 0
