"""Bad configurations: refused before any work with exit 2 and a message naming the field.

Command line and TOML alike: sizes that cannot fit in memory (estimated, with the figure
and the limit), huge numbers, non-ASCII digits, signs, empty values, settings that would
be dropped silently, paths that HDF5 would fail on later, impossible combinations. A
property test throws random such values at both and sees a run or a message, never a
traceback.
"""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcpipe.cli.main import main
from hpcpipe.run.config import FIELDS, ConfigError, make_config
from hpcpipe.run.resources import LIMIT_ENV, estimate

# (command-line words after "validate", expected message fragment)
CLI = [
    (["--depth", "1000000000000000000"], "depth = 1000000000000000000, dim = 16: the run needs"),
    (["--dim", "1000000000"], "dim = 1000000000: the run needs about"),
    (["--samples", "1000000000"], "samples = 1000000000"),
    (["--problem", "attack", "--width", "1000000000"], "width = 1000000000: the run needs"),
    (["--problem", "fewshot", "--m", "5", "--width", "1000000000"], "width = 1000000000"),
    (["--iterations", "100000000000"], "iterations = 100000000000"),
    (["--depth", "1" + "0" * 400], "depth: 100000000000...000000 (401 characters) is too large"),
    (["--depth=--4"], "depth: expected an integer, got '--4'"),
    (["--depth=²"], "depth: expected an integer, got '²' (ASCII digits 0-9 only)"),
    (["--depth", "٣"], "depth: expected an integer, got '٣' (ASCII digits 0-9 only)"),
    (["--depth", ""], "depth: expected an integer, got ''"),
    (["--depth", "4.0"], "depth: expected an integer"),
    (["--lr", "١.٥"], "lr: expected a number, got '١.٥' (ASCII digits 0-9 only)"),
    (["--lr", ""], "lr: expected a number, got ''"),
    (["--lr", "1e400"], "lr = inf is not allowed"),
    (["--lr", "-0.1"], "lr = -0.1 is not allowed"),
    (["--momentum", "٠.٥"], "momentum = '٠.٥' is not allowed"),
    (["--seed", "-1"], "seed = -1 is not allowed: a whole number in 0..9223372036854775807"),
    (["--seed", "9223372036854775808"], "seed: 9223372036854775808 is too large"),
    (["--tag", "a\nb"], "tag: 'a\\nb' holds a control character"),
    (["--np", "4", "--inject_failure", "9:1"], "rank 9 does not exist: the run has ranks 0..3"),
    (["--inject_failure", "1:1000"], "iteration 1000 never comes"),
    (["--inject_failure", "²:1"], "inject_failure = '²:1' is not allowed"),
    (["--inject_failure=-1:3"], "inject_failure = '-1:3' is not allowed"),
    (
        ["--problem", "quad-chain", "--optimizer", "pprs", "--mode", "theory", "--epsilon", "0.1"],
        "theory mode on quad-chain (smooth: beta and R known, no L) plans gd or agd only",
    ),
    (["--np", "8", "--depth", "4"], "depth must be >= the number of ranks (8)"),
]


def _validate(argv, capsys) -> tuple[int, str]:
    try:
        rc = main(["validate", *argv])
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize(("argv", "message"), CLI, ids=[" ".join(c[0])[:60] for c in CLI])
def test_command_line_refusals(argv, message, capsys):
    rc, text = _validate(argv, capsys)
    assert rc == 2 and message in text and "Traceback" not in text, text


def test_memory_estimate_names_figure_and_limit(monkeypatch, capsys):
    monkeypatch.setenv(LIMIT_ENV, "1G")
    # K = 1 (PPRS's default K = 10 stashes 10 samples' activations: a larger figure)
    rc, text = _validate(["--depth", "1000000", "--samples", "1"], capsys)  # grew for minutes
    assert rc == 2
    assert "depth = 1000000, dim = 16: the run needs about 5.34 GiB of memory" in text
    assert "more than the 1 GiB of HPCPIPE_MEMORY_LIMIT" in text
    monkeypatch.setenv(LIMIT_ENV, "64G")
    assert _validate(["--depth", "1000000", "--samples", "1"], capsys)[0] == 0
    monkeypatch.setenv(LIMIT_ENV, "lots")
    rc, text = _validate([], capsys)
    assert rc == 2 and "HPCPIPE_MEMORY_LIMIT='lots'" in text
    monkeypatch.delenv(LIMIT_ENV)
    # the layers' term is the measured 5 KB per d = 16 block (both engines)
    parts = estimate(make_config({"depth": 1000}))
    assert parts["layers"][0] == 20 * 1000 * 16 * 16


def test_np_must_be_a_whole_number_of_ranks(capsys):
    for words in (["run", "--np=-1"], ["run", "--np", "0"], ["sweep", "x.toml", "--np", "2.5"]):
        with pytest.raises(SystemExit) as e:
            main(words)
        assert e.value.code == 2
        assert "the number of ranks must be a whole number >= 1" in capsys.readouterr().err


# (TOML text, expected message fragment) for `hpcpipe validate FILE`
TOML = [
    ("lr = 1" + "0" * 400, "lr: 100000000000...000000 (401 characters) is too large"),
    ("depth = 1" + "0" * 30, "is too large (at most 9223372036854775807)"),
    ("depth = -4", "depth = -4 is not allowed"),
    ("depth = 2.5", "depth: expected an integer"),
    ("depth = true", "depth: expected an integer"),
    ("depth = [2]", "depth: expected an integer"),
    ('depth = ""', "depth: expected an integer, got ''"),
    ('depth = "²"', "got '²'"),
    ('lr = ""', "lr: expected a number, got ''"),
    ("seed = -1", "seed = -1 is not allowed"),
    ('tag = "x\\nrm -rf ~"', "holds a control character"),
    ('depth = 8\n[run]\nproblem = "l1-chain"', "key(s) depth beside the [run] table"),
    ("run = 3", "run must be a [run] table"),
    ("[run]\nsampels = 3", "unknown key 'sampels' (did you mean 'samples'?)"),
]


@pytest.mark.parametrize(("text", "message"), TOML, ids=[t[0][:40] for t in TOML])
def test_toml_refusals(tmp_path, capsys, text, message):
    f = tmp_path / "c.toml"
    f.write_text(text)
    rc, out = _validate([str(f)], capsys)
    assert rc == 2 and message in out and "Traceback" not in out, out


SWEEP = '[sweep]\nname = "s"\n{head}\n[base]\nproblem = "l1-chain"\ndepth = 4\n'
# (text of the [sweep] table, expected message fragment) for `hpcpipe sweep FILE --list`
SWEEPS = [
    ("rank = 2", "unknown key sweep.rank (did you mean 'ranks'?)"),
    ("ranks = 2.5", "ranks = 2.5 is not allowed"),
    ("ranks = true", "ranks = True is not allowed"),
    ("ranks = 0", "ranks = 0 is not allowed"),
    ("ranks = [2]", "ranks = [2] is not allowed"),
    ('ranks = "2"', "ranks = '2' is not allowed"),
    ("ranks = 8", "depth must be >= the number of ranks (8)"),
    ('out = ""', "out = '' must be a folder path"),
]


@pytest.mark.parametrize(("head", "message"), SWEEPS, ids=[s[0] for s in SWEEPS])
def test_sweep_refusals(tmp_path, capsys, head, message):
    f = tmp_path / "s.toml"
    f.write_text(SWEEP.format(head=head))
    rc = main(["sweep", str(f), "--list"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err


def test_output_paths_refused_up_front(tmp_path, capsys, monkeypatch):
    launches = []  # every refusal must come before mpiexec is started
    monkeypatch.setattr(
        "hpcpipe.cli.commands.run.relaunch", lambda np_, argv: launches.append(argv) or 0
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (tmp_path / "afile").write_text("x")
    os.symlink(tmp_path / "nowhere.h5", tmp_path / "dangling.h5")
    os.symlink(tmp_path / "nowhere", tmp_path / "dlink")
    cases = [
        (tmp_path / "afile" / "r.h5", "a part of it is a file, not a folder"),
        (tmp_path / "afile" / "deeper" / "r.h5", "a part of it is a file, not a folder"),
        (tmp_path / "dangling.h5", "is a dangling symbolic link"),
        (tmp_path / "dlink" / "r.h5", "is a file or a dangling link, not a folder"),
        (tmp_path, "is a folder: give a file name"),
        (tmp_path / "afile", "exists already"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError, match="output = ") as e:
            make_config({"output": str(path)})
        assert message in str(e.value)
        rc = main(["run", "--np", "2", "--depth", "2", "--output", str(path)])
        err = capsys.readouterr().err
        assert rc == 2 and message in err, err
    assert launches == []  # nothing is launched: rc 2 came before mpiexec
    assert list(cwd.iterdir()) == []  # and nothing was written (no runs/ folder)
    make_config({"output": str(tmp_path / "new" / "deeper" / "r.h5")})  # made when it runs


# ---------------------------------------------------------------- property test

HOSTILE_TEXT = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.integers(0, 500).map(lambda n: "1" + "0" * n),
    st.text(alphabet=st.characters(categories=["Nd", "No"]), max_size=4),  # ٣ ² ...
    st.sampled_from(["", " ", "-", "+", "--4", "+-3", "-0", "1e400", "-1e400", "nan", "inf"]),
    st.sampled_from(["0x10", "1_000", "3.0", "2.5", "١.٥", "true", "[2]", "a\nb", "\t"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=6),
)
ARGV_TEXT = HOSTILE_TEXT.filter(lambda v: "\x00" not in v)  # argv cannot hold a NUL byte
KEYS = st.sampled_from(sorted(set(FIELDS) - {"output"}))


def _accepted_or_refused(rc, text):
    assert "Traceback" not in text, text
    assert rc in (0, 2), (rc, text)
    if rc == 2:
        assert "error" in text, text  # a message, not silence


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, ARGV_TEXT, min_size=1, max_size=3))
def test_random_command_lines_run_or_exit_2(values):
    import contextlib
    import io

    argv = ["validate"]
    for k, v in values.items():
        argv += [f"--{k}={v}"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    _accepted_or_refused(rc, buf.getvalue())


def _toml_value(v: str):
    """The value as TOML writes it: a number where it parses as one, else a string."""
    import json

    try:
        int(v, 10)
        if v.strip() == v and v.isascii() and v.lstrip("+-").isdigit() and "_" not in v:
            return v
    except ValueError:
        pass
    return json.dumps(v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, HOSTILE_TEXT, min_size=1, max_size=3), st.booleans())
def test_random_toml_files_run_or_exit_2(tmp_path_factory, values, table):
    import contextlib
    import io

    f = tmp_path_factory.mktemp("toml") / "c.toml"
    lines = ["[run]"] if table else []
    lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    f.write_text("\n".join(lines) + "\n")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main(["validate", str(f)])
    _accepted_or_refused(rc, buf.getvalue())


def test_a_config_file_without_config_is_named_as_such(tmp_path, capsys, monkeypatch):
    """``hpcpipe run confg.toml`` (a path where key=value overrides go): exit 2, one line
    that points to --config and says whether the file exists; nothing is written."""
    monkeypatch.chdir(tmp_path)
    for word, there in (("confg.toml", "no such file"), ("jobs/run.toml", "no such file")):
        try:
            rc = main(["run", word, "--no-output"])
        except SystemExit as e:
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and "--config" in err and there in err and "Traceback" not in err, err
    (tmp_path / "mine.toml").write_text("depth = 2\n")
    rc = main(["run", "mine.toml", "--no-output"])
    err = capsys.readouterr().err
    assert rc == 2 and "--config (it exists)" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.toml"]
