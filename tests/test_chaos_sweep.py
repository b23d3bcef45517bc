"""A chaos sweep (slow lane): a 6-point sweep on 2 ranks is interrupted at least 10 times at
seeded-random points, by kill -9 of a rank, SIGTERM of the launcher, or a full disk
(ENOSPC raised in rank 0's save path), and rerun each time (a launch that ends before its
interruption does not count; at most 40 launches); its final files must equal
those of an uninterrupted sweep: iterates, losses and model-clock pipeline times bitwise,
status complete. The seed (HPCPIPE_CHAOS_SEED, default 27) is printed on failure."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcpipe.cli.launch import mpiexec_command
from hpcpipe.run.results import ResultsError, load
from hpcpipe.studies.sweep import load_sweep

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
SEED = int(os.environ.get("HPCPIPE_CHAOS_SEED", "27"))
TRIALS = 10  # interruptions that really stopped a launch
LAUNCHES = 40
ITERATIONS = 36
WAIT = 300  # s: a hang guard for every launch
SWEEP = """
[sweep]
name = "chaos"
out = "{out}"
ranks = 2
[base]
problem = "l1-chain"
depth = 2
dim = 8
optimizer = "pprs"
samples = 2
gamma = 0.05
lr = 0.05
iterations = {iterations}
flush_every = 3
layer_time = 0.004
clock = "model"
progress = "off"
[grid]
seed = [0, 1, 2, 3, 4, 5]
"""
DISK_FULL = """
import errno, os, sys
from hpcpipe.run import results
nth, seen = int(sys.argv[1]), []
def hook(point):
    if point == "rows-flushed":
        seen.append(point)
        if len(seen) == nth:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
results.SAVE_HOOK = hook
from hpcpipe.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def _ranks_of(marker: str) -> dict[int, int]:
    """{MPI rank: pid} of the processes whose command line holds ``marker``."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or d.name == str(os.getpid()):
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in cmd and "--inside" in cmd:
            for e in env:
                if e.startswith(b"PMI_RANK="):
                    out[int(e[9:])] = int(d.name)
    return out


def _rows(path: Path) -> int:
    try:
        return len(load(path).iterations["iteration"]) if path.exists() else 0
    except ResultsError:
        return 0


def _complete(toml: Path) -> bool:
    return all(_rows(pt.path) >= ITERATIONS for pt in load_sweep(toml).points)


def _final(path: Path) -> dict[str, np.ndarray]:
    r = load(path)
    assert r.status == "complete", (path, r.status)
    out = {k: r.iterations[k] for k in ("iteration", "loss", "pipeline_time")}
    # the timeline is a set of events: each flush appends its events rank by rank, so a
    # run stopped between two flushes (SIGTERM) stores the same events in another order
    tl = r.timeline
    order = np.lexsort([tl[k] for k in ("item", "kind", "stage", "rank", "iteration")])
    out.update({f"timeline/{k}": v[order] for k, v in tl.items()})
    with h5py.File(path, "r") as f:
        for k in f["state/optimizer"]:
            out[f"state/{k}"] = f[f"state/optimizer/{k}"][()]
    return out


def _sweep(toml: Path, timeout: float = WAIT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", "sweep", str(toml)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def _repaired(stdout: str) -> str:
    """A note when the launch repaired a file a killed writer left short (h5clear
    --increment's repair, results.recover_truncated)."""
    n = stdout.count("as h5clear --increment does")
    return f" (resumed a file left short of its end-of-file address: {n})" if n else ""


def _interrupt(kind: str, toml: Path, rng: random.Random, log: list) -> bool:
    """One launch of the unfinished sweep, interrupted (bounded by WAIT); True if stopped."""
    pts = load_sweep(toml).points
    todo = [pt for pt in pts if _rows(pt.path) < ITERATIONS]
    if kind == "enospc":
        script = toml.parent / "disk_full.py"
        script.write_text(DISK_FULL)
        nth = rng.randint(1, 6)
        args = [str(script), str(nth), "sweep", str(toml), "--point", str(todo[0].index)]
        args.append("--inside")
        env = dict(ENV, HPCPIPE_INSIDE_MPI="1")
        p = subprocess.run(mpiexec_command(2, args), capture_output=True, text=True,
                           timeout=WAIT, env=env)  # fmt: skip
        log.append(f"enospc at flush {nth}: exit {p.returncode}{_repaired(p.stdout)}")
        return p.returncode != 0
    target = todo[0]  # the point the sweep works on next: stop it between its row now and
    rows = rng.randint(min(_rows(target.path) + 1, ITERATIONS - 1), ITERATIONS - 1)  # the end
    proc = subprocess.Popen(  # one point per launch: every point meets its interruptions
        [sys.executable, "-m", "hpcpipe", "sweep", str(toml), "--point", str(target.index)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,
    )
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < WAIT and _rows(target.path) < rows:
        time.sleep(0.05)
    what = "finished first"
    if proc.poll() is None:
        if kind == "sigterm":
            proc.send_signal(signal.SIGTERM)
            what = "SIGTERM to the launcher"
        else:
            ranks = _ranks_of(str(toml))
            if ranks:
                rank = rng.choice(sorted(ranks))
                os.kill(ranks[rank], signal.SIGKILL)
                what = f"kill -9 of rank {rank}"
    out, _ = proc.communicate(timeout=WAIT)
    log.append(
        f"{kind} at point {target.index} row {rows}: {what}, exit {proc.returncode}"
        + _repaired(out)
    )
    return what != "finished first" and proc.returncode != 0


@pytest.mark.slow
def test_chaos_sweep_ends_as_an_uninterrupted_sweep(tmp_path):
    t0 = time.time()
    ref_toml, toml = tmp_path / "ref.toml", tmp_path / "chaos.toml"
    ref_toml.write_text(SWEEP.format(out=tmp_path / "ref", iterations=ITERATIONS))
    toml.write_text(SWEEP.format(out=tmp_path / "chaos", iterations=ITERATIONS))
    p = _sweep(ref_toml)
    assert p.returncode == 0, p.stderr
    rng, log = random.Random(SEED), []
    try:
        stopped = launches = 0
        while stopped < TRIALS and launches < LAUNCHES and not _complete(toml):
            launches += 1
            stopped += _interrupt(rng.choice(("kill9", "sigterm", "enospc")), toml, rng, log)
        assert stopped >= TRIALS, f"only {stopped} of {launches} launches were interrupted"
        p = _sweep(toml)
        log.append(f"final launch: exit {p.returncode}{_repaired(p.stdout)}")
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        for a, b in zip(load_sweep(ref_toml).points, load_sweep(toml).points):
            want, got = _final(a.path), _final(b.path)
            assert want.keys() == got.keys()
            for k, v in want.items():
                np.testing.assert_array_equal(got[k], v, err_msg=f"{b.path}: {k}")
    except BaseException:
        print(
            f"chaos sweep failed with seed {SEED} (HPCPIPE_CHAOS_SEED); trials:\n" + "\n".join(log)
        )
        raise
    print(
        f"{stopped} interruptions in {launches} launches, seed {SEED}, "
        f"{time.time() - t0:.1f} s:\n" + "\n".join(log)
    )
