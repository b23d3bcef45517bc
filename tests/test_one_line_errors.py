"""Every command, given a representative bad input or an environmental fault, says why in
one line and exits non-zero, with no Python traceback (HPCPIPE_DEBUG=1 shows it)."""

import os
import re
import shlex
import subprocess
import sys

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ENV.pop("HPCPIPE_DEBUG", None)
SMALL = ["--problem", "l1-chain", "--depth", "2", "--dim", "8", "--optimizer", "gd"]
SMALL += ["--lr", "0.05", "--iterations", "3", "--progress", "off"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A good result, one whose iteration column holds strings, one whose columns differ
    in length, a FIFO, an existing non-result file, a sweep file."""
    d = tmp_path_factory.mktemp("bad")
    good = d / "good.h5"
    run(
        make_config(
            {"problem": "l1-chain", "depth": 2, "dim": 8, "optimizer": "gd", "lr": 0.05}
            | {"iterations": 4, "progress": "off", "output": str(good), "timeline_limit": 100}
        ),
        MPI.COMM_SELF,
    )
    strings, ragged = d / "strings.h5", d / "ragged.h5"
    for p in (strings, ragged):
        p.write_bytes(good.read_bytes())
    with h5py.File(strings, "r+") as f:
        del f["iterations/iteration"]
        f["iterations/iteration"] = np.array([b"a", b"b", b"c", b"d"])
    with h5py.File(ragged, "r+") as f:
        loss = f["iterations/loss"][()]
        del f["iterations/loss"]
        f["iterations/loss"] = loss[:2]
    fifo = d / "fifo.h5"
    os.mkfifo(fifo)
    existing = d / "existing.txt"
    existing.write_text("keep me\n")
    sweep = d / "s.toml"
    sweep.write_text('[sweep]\nname = "s"\nranks = 1\n[base]\nproblem = "l1-chain"\n')
    return {
        "good": good,
        "strings": strings,
        "ragged": ragged,
        "fifo": fifo,
        "existing": existing,
        "sweep": sweep,
        "dir": d,
    }


CASES = {
    "run unwritable /proc": ["run", *SMALL, "--output", "/proc/x.h5"],
    "run unwritable /sys": ["run", *SMALL, "--output", "/sys/x.h5"],
    "run watchdog": ["run", "--np", "2", *SMALL, "--timeout", "1e-9", "--no-output"],
    "run bad key": ["run", *SMALL, "--no-such-key", "1"],
    "trace unwritable": ["trace", "{good}", "-o", "/proc/x.json"],
    "export unwritable": ["export", "{good}", "-o", "/proc/nope/x.csv"],
    "trace strings": ["trace", "{strings}", "-o", "{dir}/t.json"],
    "export strings": ["export", "{strings}", "-o", "{dir}/e.csv"],
    "export ragged": ["export", "{ragged}", "-o", "{dir}/r.csv"],
    "trace fifo": ["trace", "{fifo}", "-o", "{dir}/f.json"],
    "plot missing": ["plot", "{dir}/missing.h5", "-o", "{dir}/p.png"],
    "jobs onto a file": ["jobs", "generate", "{sweep}", "--out", "{existing}"],
    "analyze missing": ["analyze", "{dir}/nope", "-o", "{dir}/rep"],
    "sweep missing": ["sweep", "{dir}/nope.toml"],
    "validate bad value": ["validate", "--depth", "0"],
    "schedule unknown": ["schedule", "nope"],
    "simulate unknown": ["simulate", "--schedule", "nope"],
    "trace disk full": ["trace", "{good}", "-o", "{dir}/full.json"],
    "export disk full": ["export", "{good}", "-o", "{dir}/full"],
    "sweep grid disk full": ["sweep", "{sweep}", "--out", "{dir}/sweep-full"],
    "run disk full": ["run", *SMALL, "--inject-failure", "enospc:2", "--output", "{dir}/f.h5"],
}
# a full disk injected into the writers other than a run's (hpcpipe.run.atomic)
FULL = {
    "trace disk full": "full.json",
    "export disk full": "full-timeline.csv",
    "sweep grid disk full": "grid.json",
}


def _hpcpipe(args, env=ENV):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_one_line_and_no_traceback(case, files):
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in CASES[case]]
    before = files["existing"].read_bytes()
    env = dict(ENV, HPCPIPE_INJECT_DISK_FULL=FULL[case]) if case in FULL else ENV
    p = _hpcpipe(args, env)
    # the MPI library's own report of MPI_Abort (the failing rank's way to stop the job)
    # may follow; every other line is hpcpipe's, and the last of them says why
    lines = [
        line
        for line in p.stderr.splitlines()
        if line.strip() and not line.startswith("Abort(") and "MPI_Abort" not in line
    ]
    assert p.returncode not in (0, None), (case, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, (case, p.stderr)
    assert lines and lines[-1].startswith("hpcpipe"), (case, p.stderr)
    if case == "run watchdog":  # both ranks answer the census: rank 0 reports a stall
        assert len(lines) == 1, (case, p.stderr)
        assert re.match(
            r"hpcpipe: rank 0 of 2 failed: watchdog: no progress .*\(a stall\)", lines[0]
        )
    elif not lines[0].startswith("usage:"):  # argparse prints its usage line first
        assert len(lines) == 1, (case, p.stderr)
    assert files["existing"].read_bytes() == before  # nothing already written is touched


def test_debug_switch_shows_the_traceback(files):
    args = ["trace", str(files["good"]), "-o", "/proc/x.json"]
    p = _hpcpipe(args, env=dict(ENV, HPCPIPE_DEBUG="1"))
    assert p.returncode != 0 and "Traceback" in p.stderr, p.stderr
    p = _hpcpipe(["--debug", *args])
    assert p.returncode != 0 and "Traceback" in p.stderr, p.stderr


def test_a_reader_that_goes_away_stops_the_command_quietly(files):
    """``hpcpipe sweep --list F | head -1``: status 141 (128 + SIGPIPE, as git), nothing on
    stderr. Deterministic: the read end of the pipe is closed before the command starts."""
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "hpcpipe", "sweep", str(files["sweep"]), "--list"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            env=ENV,
        )
    finally:
        os.close(write)
    assert p.returncode == 141 and p.stderr == "", (p.returncode, p.stderr)


def test_sweep_list_into_head(tmp_path):
    """The shell pipeline itself, with a listing (3000 points) far larger than a pipe holds."""
    seeds = ", ".join(map(str, range(3000)))
    toml = tmp_path / "big.toml"
    toml.write_text(
        f'[sweep]\nname = "big"\nout = "{tmp_path}/big"\n[base]\nproblem = "l1-chain"\n'
        f"depth = 2\n[grid]\nseed = [{seeds}]\n"
    )
    cmd = f"{shlex.quote(sys.executable)} -m hpcpipe sweep {shlex.quote(str(toml))} --list"
    p = subprocess.run(
        ["bash", "-c", f'{cmd} | head -1; echo "status ${{PIPESTATUS[0]}}" >&2'],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert p.stdout.startswith("   0  ranks   1  missing") and p.stdout.count("\n") == 1
    assert p.stderr == "status 141\n", p.stderr
