"""Options a command does not take are refused by name (exit 2, one line, before any work),
and ``sweep --np`` says what it does when the sweep file fixes the ranks."""

import os
import subprocess
import sys

import pytest

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

SWEEP = """
[sweep]
name = "tiny"
ranks = 1
[base]
problem = "l1-chain"
executor = "mpi"
optimizer = "gd"
iterations = 2
progress = "off"
[grid]
lr = [0.01]
"""


def hpcpipe(*args, cwd=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "args, option",
    [
        (["demo", "--typo", "1"], "--typo"),
        (["demo", "attack", "--budgt", "3"], "--budgt"),
        (["demo", "--figure=x.png", "--no-figur3"], "--no-figur3"),
        (["info", "--bogus"], "--bogus"),
    ],
)
def test_unknown_option_is_refused_by_name(tmp_path, args, option):
    p = hpcpipe(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"unknown option {option}" in lines[0], p.stderr
    assert "Traceback" not in p.stderr and not list(tmp_path.iterdir())


def test_known_abbreviation_and_help_still_work(tmp_path):
    p = hpcpipe("demo", "--no-fig", "--help", cwd=tmp_path)
    assert p.returncode == 0 and "--no-figure" in p.stdout


def test_sweep_np_below_the_file_ranks_is_refused(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(SWEEP.replace("ranks = 1", "ranks = 2"))
    p = hpcpipe("sweep", str(f), "--np", "1", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--np 1 is too few" in lines[0] and "[sweep] ranks" in lines[0]
    assert not (tmp_path / "out").exists()


def test_sweep_np_above_the_file_ranks_says_so_in_one_line(tmp_path):
    """--np 3 for points of 2 ranks: one point at a time, one rank idle, said in one line;
    --np 2 for points of 1 rank: two side by side, nothing idle, nothing said."""
    f = tmp_path / "s.toml"
    f.write_text(SWEEP.replace("ranks = 1", "ranks = 2"))
    p = hpcpipe("sweep", str(f), "--np", "3", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    notes = [ln for ln in p.stderr.splitlines() if "note:" in ln]
    assert notes == [
        "hpcpipe sweep: note: the sweep file gives its points at most 2 rank(s) "
        "([sweep] ranks); --np 3 runs 1 point(s) side by side and leaves 1 rank(s) idle"
    ]
    assert len(list((tmp_path / "out").glob("*.h5"))) == 1
    f.write_text(SWEEP.replace("lr = [0.01]", "lr = [0.01, 0.02]"))
    p = hpcpipe("sweep", str(f), "--np", "2", "--out", str(tmp_path / "out1"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "note:" not in p.stderr
    assert len(list((tmp_path / "out1").glob("*.h5"))) == 2
