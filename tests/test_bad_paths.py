"""Path-valued settings the operating system would refuse (a name longer than NAME_MAX, a
part of the path that is a file, a folder that may not be written, a link loop) stop every
command before any work with one line naming the setting, and exit status 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcpipe.cli.main import main
from hpcpipe.run.config import path_error

ROOT = Path(__file__).resolve().parent.parent
SWEEP = str(ROOT / "jobs" / "sweeps" / "smooth.toml")
LONG = "1" + "0" * 255  # one byte over the usual NAME_MAX (255)


@pytest.fixture
def where(tmp_path, monkeypatch):
    """A folder with a plain file ``afile`` and a symbolic-link loop ``loop``; the cwd."""
    (tmp_path / "afile").write_text("not a folder\n")
    os.symlink("loop", tmp_path / "loop")
    monkeypatch.chdir(tmp_path)
    return tmp_path


BAD = {
    "name too long": (LONG, "longer than the file system allows"),
    "name too long below": (f"{LONG}/x.h5", "longer than the file system allows"),
    "path too long": ("/".join(["d" * 200] * 25), "longer than the file system allows"),
    "part is a file": ("afile/x.h5", "a part of it is a file, not a folder"),
    "link loop": ("loop/x.h5", "a loop of symbolic links"),
}


@pytest.mark.parametrize("write", [True, False])
@pytest.mark.parametrize("case", sorted(BAD))
def test_path_error_names_the_field_the_fault_and_the_fix(where, case, write):
    path, why = BAD[case]
    err = path_error("output", path, write=write)
    assert err is not None and err.startswith("output = ") and why in err
    assert "choose" in err and "\n" not in err and len(err) < 300


def test_path_error_accepts_good_paths_and_refuses_a_folder_it_may_not_write(where, monkeypatch):
    assert path_error("output", "new/deeper/x.h5", write=True) is None
    assert path_error("output", "afile", write=False) is None
    assert path_error("machine", "missing.toml", write=False) is None  # the caller says so
    (where / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: real(p, m) and "ro" not in str(p))
    err = path_error("output", "ro/x.h5", write=True)
    assert err is not None and "permission denied" in err and "you may write" in err


# (argv with {} for the bad path, the field the message names)
COMMANDS = [
    (["run", "--machine", "{}"], "machine = "),
    (["run", "--output", "{}"], "output = "),
    (["run", "--resume", "{}"], "--resume = "),
    (["validate", "{}"], "config file = "),
    (["sweep", "{}"], "sweep file = "),
    (["sweep", SWEEP, "--out", "{}"], "--out = "),
    (["calibrate", "--output", "{}"], "--output = "),
    (["jobs", "generate", SWEEP, "--out", "{}"], "--out = "),
    (["schedule", "gpipe", "--write-csv", "{}"], "--write-csv = "),
    (["schedule", "--from-csv", "{}"], "--from-csv = "),
    (["analyze", "{}", "-o", "report"], "results folder = "),
    (["analyze", ".", "-o", "{}"], "-o = "),
    (["trace", "{}", "-o", "t.json"], "result = "),
    (["export", "{}"], "result = "),
    (["simulate", "gpipe", "--plot", "{}"], "--plot = "),
]


@pytest.mark.parametrize("case", ["name too long", "part is a file"])
@pytest.mark.parametrize(("argv", "field"), COMMANDS, ids=lambda a: "-".join(a)[:40])
def test_every_path_setting_is_refused_before_any_work(where, capsys, argv, field, case):
    path, why = BAD[case]
    before = sorted(p.name for p in where.iterdir())
    rc = main([a.replace("{}", path) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and why in lines[0], err
    assert "Traceback" not in err and out == ""  # nothing ran, nothing was printed
    assert sorted(p.name for p in where.iterdir()) == before  # nothing was written
