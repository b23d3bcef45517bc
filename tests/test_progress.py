"""Progress on waits (``Waiting``): quiet for the first 2 s, then rate-limited lines on
stderr (a bar on a terminal), nothing when off or on ranks other than 0. A fake clock
drives it: no test depends on the machine's speed."""

import io

import pytest
from mpi4py import MPI

from hpcpipe.run import progress
from hpcpipe.run.progress import Waiting


class Clock:
    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_short_wait_shows_nothing():
    out = io.StringIO()
    w = Waiting("short", 100, stream=out, clock=Clock(0.01))  # 100 steps in about 1 s
    for i in range(100):
        w.update(i + 1)
    w.close()
    assert out.getvalue() == ""


def test_a_long_wait_in_a_log_shows_a_line_every_10_s_then_the_end():
    out = io.StringIO()  # not a terminal: "auto" means lines
    w = Waiting("training", 60, stream=out, clock=Clock(1.0))  # one step a second
    for i in range(60):
        w.update(i + 1)
    w.close()
    lines = out.getvalue().splitlines()
    # first after the 2 s delay, then every 10 s (not every step), and the end
    assert lines[0].startswith("training: 2/60 (2 s)")
    assert len(lines) == 7 and lines[-1].startswith("training: 60/60")
    assert all(ln.startswith("training: ") for ln in lines)


def test_a_terminal_gets_a_bar_redrawn_at_most_every_0_2_s():
    out = Tty()
    w = Waiting("train", 100, stream=out, clock=Clock(0.05))
    for i in range(100):
        w.update(i + 1)
    w.close()
    text = out.getvalue()
    draws = text.count("\r")
    assert 0 < draws <= (100 * 0.05 - 2) / 0.2 + 2
    assert text.endswith("] 100/100\n")


@pytest.mark.parametrize("mode, enabled", [("off", True), ("auto", False), ("lines", False)])
def test_off_or_another_rank_shows_nothing(mode, enabled):
    out = Tty()
    w = Waiting("x", 50, mode, enabled, stream=out, clock=Clock(1.0))
    for i in range(50):
        w.update(i + 1)
    w.close()
    assert out.getvalue() == ""


def test_the_attack_classifier_training_shows_its_progress(tmp_path, monkeypatch, capsys):
    pytest.importorskip("sklearn")
    from hpcpipe.problems import digits

    monkeypatch.setenv("HPCPIPE_CACHE", str(tmp_path))
    monkeypatch.setattr(progress.time, "monotonic", Clock(1.0))  # each step "takes" 1 s
    digits.train_classifier(MPI.COMM_SELF, 2, 4, 0, iterations=30, progress="lines")
    err = capsys.readouterr().err.splitlines()
    assert err and all(ln.startswith("training the digits classifier") for ln in err)
    assert err[-1].split(": ")[-1].startswith("30/30")
    # cached now: the second call trains nothing and shows nothing
    digits.train_classifier(MPI.COMM_SELF, 2, 4, 0, iterations=30, progress="lines")
    assert capsys.readouterr().err == ""
    # quiet (the demo's --quiet) shows nothing either
    digits.train_classifier(MPI.COMM_SELF, 2, 4, 1, iterations=30, progress="off")
    assert capsys.readouterr().err == ""
