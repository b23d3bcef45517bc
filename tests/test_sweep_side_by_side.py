"""Points side by side (``hpcpipe sweep --np N`` with room for several points) write what a
one-at-a-time sweep writes, point for point; and the digits problems' in-process caches
(``load_digits_split``, the trained classifier) leave every problem bitwise as it was."""

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.problems import digits
from hpcpipe.run.results import load
from hpcpipe.studies.sweep import deal, load_sweep, point_state, run_points

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
ENV.pop("HPCPIPE_DEBUG", None)
SWEEP = """
[sweep]
name = "side"
out = "{out}"
ranks = 1
[base]
progress = "off"
flush_every = 4
[[cases]]
label = "gd"
problem = "l1-chain"
depth = 2
dim = 8
iterations = 15
clock = "model"
optimizer = "gd"
[[cases]]
label = "pprs"
problem = "l1-chain"
depth = 3
dim = 8
iterations = 12
clock = "model"
optimizer = "pprs"
samples = 2
[[cases]]
label = "attack"
problem = "attack-targeted"
executor = "simulated"
width = 32
depth = 8
m = 1
radius = 0.15
optimizer = "pprs"
samples = 2
gamma = 0.003
iterations = 100000
time_budget = 200
[grid]
seed = [0, 1, 2]
"""
# measured, not computed: what differs between two runs of one point (the wall-clock
# column, the machine's load and the other processes' CPU while it ran)
WALL = {"wall_time"}
MEASURED_INFO = {"foreign_cpu", "load_start", "load_end"}


def _same_point(a, b) -> None:
    ra, rb = load(a), load(b)
    assert ra.status == rb.status == "complete", (a, ra.status, rb.status)
    assert {**ra.config, "output": ""} == {**rb.config, "output": ""}  # its own path
    kept = lambda info: {k: v for k, v in info.items() if k not in MEASURED_INFO}  # noqa: E731
    assert kept(ra.info) == kept(rb.info) and len(kept(ra.info)) >= 3
    assert list(ra.iterations) == list(rb.iterations)
    for col in ra.iterations:
        if col in WALL:
            continue
        x, y = np.asarray(ra.iterations[col]), np.asarray(rb.iterations[col])
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), (a, col)


def _sweep(tmp_path, name: str):
    toml = tmp_path / f"{name}.toml"
    toml.write_text(SWEEP.format(out=tmp_path / name))
    return toml, load_sweep(toml)


def _np2(toml):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", "sweep", str(toml), "--np", "2"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )


def test_points_side_by_side_write_what_one_at_a_time_writes(tmp_path):
    _, alone = _sweep(tmp_path, "alone")
    counts = run_points(MPI.COMM_SELF, alone, log=lambda m: None)
    assert counts == {"ran": 9, "resumed": 0, "skipped": 0, "stopped": False}
    toml, side = _sweep(tmp_path, "side")
    p = _np2(toml)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "note:" not in p.stderr  # 2 ranks, points of 1: nothing idle
    lines = p.stdout.splitlines()
    for pt in side.points:  # one progress line per point, whichever group ran it
        said = f"[side] point {pt.index} {pt.label}: complete ("
        assert sum(ln.startswith(said) for ln in lines) == 1
    assert "[side] 9 ran, 0 resumed, 0 skipped; 9/9 points finished" in p.stdout
    for a, b in zip(alone.points, side.points, strict=True):
        _same_point(a.path, b.path)

    # run again after losing two files: the finished points are skipped, the lost ones
    # run again (dealt to the two groups), and come out the same
    for i in (4, 7):
        side.points[i].path.unlink()
    p = _np2(toml)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[side] 2 ran, 0 resumed, 7 skipped; 9/9 points finished" in p.stdout
    assert sum("skipped (complete)" in ln for ln in p.stdout.splitlines()) == 7
    assert [point_state(pt) for pt in side.points] == ["complete"] * 9
    for i in (4, 7):
        _same_point(alone.points[i].path, side.points[i].path)


def test_the_deal_gives_every_point_to_one_group_in_turn():
    todo = list(range(11))
    hands = deal(todo, 3)
    assert hands == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert sorted(sum(hands, [])) == todo
    assert deal(todo, 3) == hands  # depends on nothing but the list


def test_digits_split_is_read_once_and_cannot_be_changed():
    fresh = digits._digits_split.__wrapped__(3)  # computed now, past the cache
    first, again = digits.load_digits_split(3), digits.load_digits_split(3)
    assert all(a is b for a, b in zip(first, again))  # the same arrays: read once
    for a, b in zip(first, fresh, strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 1
    assert digits.load_digits_split(4)[0].tobytes() != first[0].tobytes()


def test_cached_classifier_gives_the_same_problem_and_cannot_be_changed(tmp_path, monkeypatch):
    """The attack built from the classifier kept in the process is bitwise the one built
    from the cache file; a caller that changes its weights changes nobody else's."""
    digits._CLASSIFIERS.clear()
    first = digits.attack_targeted(MPI.COMM_SELF, 8, 32, 2, 1, 0.15, progress="off")
    assert len(digits._CLASSIFIERS) == 1
    first.weights[:] = 0.0  # a careless caller
    second = digits.attack_targeted(MPI.COMM_SELF, 8, 32, 2, 1, 0.15, progress="off")
    digits._CLASSIFIERS.clear()
    third = digits.attack_targeted(MPI.COMM_SELF, 8, 32, 2, 1, 0.15, progress="off")
    assert not np.any(second.weights == 0.0)
    assert second.weights.tobytes() == third.weights.tobytes()
    for name in ("x", "targets"):
        assert getattr(second.batch, name).tobytes() == getattr(third.batch, name).tobytes()
    assert [b.tobytes() for b in second.box] == [b.tobytes() for b in third.box]
    assert second.info == third.info


def test_the_sweeps_tally_reads_no_file_again(tmp_path, monkeypatch, capsys):
    """Each point's state is read once, before it runs; the closing tally uses what the
    runs returned (reading 1100 finished files again took 50 s, the other ranks idle)."""
    from hpcpipe.studies import sweep as sweep_mod

    toml = tmp_path / "s.toml"
    text = SWEEP.format(out=tmp_path / "out")  # the two l1-chain cases: 6 points
    cut = text.index('[[cases]]\nlabel = "attack"')
    toml.write_text(text[:cut] + text[text.index("[grid]") :])
    reads = []

    def counted(pt):
        reads.append(pt.index)
        return point_state(pt)

    monkeypatch.setattr(sweep_mod, "point_state", counted)
    assert sweep_mod.main_inside(MPI.COMM_SELF, str(toml), None, None) == 0
    assert "6 ran, 0 resumed, 0 skipped; 6/6 points finished" in capsys.readouterr().out
    assert sorted(reads) == list(range(6))  # once each, before its run
