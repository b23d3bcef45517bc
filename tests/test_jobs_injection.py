"""Generated Slurm scripts: hostile values are refused, or written so that they stay inert.

Every option of ``hpcpipe jobs generate`` and every sweep field that reaches a script or a
file name is tried with shell metacharacters, newlines and spaces. An accepted value must
give scripts that pass ``bash -n``, whose ``#SBATCH`` lines hold only Slurm-syntax words,
where the value is one whole shell word wherever it appears, and which, run with stand-in
``srun`` / ``mpiexec`` / ``python3``, create no file and pass the value on unchanged.
"""

import os
import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from hpcpipe.cli.launch import SAFE_MAIN
from hpcpipe.cli.main import main
from hpcpipe.run.config import ConfigError
from hpcpipe.studies.jobs import JobOptions, generate
from hpcpipe.studies.sweep import load_sweep

HOSTILE = [
    "pmi2; touch PWNED",
    "x\ntouch PWNED",
    "x\rtouch PWNED",
    "my proj",
    "$(touch PWNED)",
    "`touch PWNED`",
    "a'b\"c PWNED",
    "x #PWNED",
    "x && touch PWNED",
    "x | tee PWNED",
    "x > PWNED",
    "${IFS}touch${IFS}PWNED",
    "--time=1 PWNED",
    "01:00:00\n#SBATCH --wrap=touch PWNED",
    "٣:00",  # non-ASCII digits
    "",
]
OPTIONS = ["partition", "account", "time", "mpi", "python", "activate"]

SWEEP = """
[sweep]
name = {name}
ranks = {ranks}
[base]
problem = "l1-chain"
depth = 2
dim = 4
iterations = 2
progress = "off"
tag = {tag}
[[cases]]
label = {label}
[grid]
lr = [0.01]
"""
GOOD = {"name": '"s"', "ranks": "2", "tag": '"t"', "label": '"c"'}

FAKE = """#!/bin/bash
printf '%s\\0' "$(basename "$0")" "$@" >> "$HPCPIPE_FAKE_LOG"
"""


def _toml(value: str) -> str:
    return '"' + value.encode("unicode_escape").decode().replace('"', '\\"') + '"'


def _sweep_file(tmp_path: Path, **fields) -> Path:
    f = tmp_path / "s.toml"
    f.write_text(SWEEP.format(**{**GOOD, **fields}))
    return f


def _fake_bin(tmp_path: Path) -> Path:
    b = tmp_path / "fakebin"
    b.mkdir(exist_ok=True)
    for tool in ("srun", "mpiexec", "python3", "sbatch"):
        (b / tool).write_text(FAKE if tool != "sbatch" else FAKE + "echo 1\n")
        (b / tool).chmod(0o755)
    return b


SBATCH_LINE = re.compile(r"#SBATCH --[a-z-]+(=[A-Za-z0-9_.,:%+=/-]+)?")


def _inspect(script: Path, value: str) -> None:
    """bash -n; #SBATCH lines in Slurm syntax; the value, where present, is one shell word."""
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, (script.name, p.stderr)
    text = script.read_bytes().decode()
    for line in text.split("\n"):
        if line.startswith("#SBATCH"):
            assert SBATCH_LINE.fullmatch(line), (script.name, line)
    if not value or value not in text:
        return
    words = shlex.split(text, comments=True)
    assert any(value in w for w in words), (script.name, value)  # never split into words
    for line in text.split("\n"):
        assert not line.lstrip().startswith("#") or value not in line  # no value in a comment


def _run_scripts(out: Path, tmp_path: Path) -> None:
    """Run every generated script with stand-in tools (they log their arguments)."""
    fake = _fake_bin(tmp_path)
    log = tmp_path / "calls.log"
    log.write_bytes(b"")
    env = dict(
        os.environ,
        PATH=f"{fake}:{os.environ['PATH']}",
        HPCPIPE_FAKE_LOG=str(log),
        SLURM_SUBMIT_DIR=str(out),
        SLURM_ARRAY_TASK_ID="0",
        SLURM_NTASKS="2",
    )
    for script in sorted(out.glob("*.sbatch")) + [out / "submit.sh"]:
        subprocess.run(["bash", str(script)], cwd=out, env=env, capture_output=True, timeout=30)


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("value", HOSTILE, ids=[repr(v) for v in HOSTILE])
def test_hostile_option_is_refused_or_inert(tmp_path, option, value):
    sweep = _sweep_file(tmp_path)
    out = tmp_path / "job"
    opts = replace(JobOptions(), **{option: value})
    try:
        generate(str(sweep), out, opts)
    except ConfigError as e:
        assert f"--{option}" in str(e)
        assert not out.exists()  # refused before anything is written
        return
    assert option in ("python", "activate", "partition", "account") and (
        value == "" or option in ("python", "activate")
    )
    for script in list(out.glob("*.sbatch")) + [out / "submit.sh"]:
        _inspect(script, value)
    _run_scripts(out, tmp_path)
    assert not list(tmp_path.rglob("PWNED")) and not list(Path.cwd().glob("PWNED"))
    if option == "python" and value:
        raw = (tmp_path / "calls.log").read_bytes().decode()
        # srun got it as one argument, starting hpcpipe off the working folder (SAFE_MAIN)
        assert f"\0{value}\0-c\0{SAFE_MAIN}\0sweep" in raw
    if option == "activate" and value:
        words = shlex.split((out / "array-2.sbatch").read_bytes().decode(), comments=True)
        assert words[words.index(".") + 1] == f"{value}/bin/activate"


# (TOML field, hostile value) -> a message fragment when refused, None when accepted and inert
TOML_CASES = [
    ("name", "x\nrm -rf ~/data #", "name = 'x\\nrm -rf ~/data #' is not allowed"),
    ("name", "my sweep", "is not allowed"),
    ("name", "$(touch PWNED)", "is not allowed"),
    ("name", "../up", "is not allowed"),
    ("ranks", "2; touch PWNED", "ranks = '2; touch PWNED' is not allowed"),
    ("ranks", "2\ntouch PWNED", "is not allowed"),
    ("label", "../../../../outside/pwn", None),
    ("label", "x\nrm -rf ~/data #", None),
    ("label", "$(touch PWNED) `touch PWNED`; a b", None),
    ("label", "..", None),
    ("label", "/abs/path", None),
    ("label", "a" * 400, None),
    ("tag", "x\ntouch PWNED; $(touch PWNED)", "holds a control character"),
    ("tag", "x; touch PWNED $(touch PWNED) `id` 'a b'", None),
]


@pytest.mark.parametrize(("field", "value", "message"), TOML_CASES)
def test_hostile_sweep_field_is_refused_or_inert(tmp_path, field, value, message):
    sweep = _sweep_file(tmp_path, **{field: _toml(value)})
    out = tmp_path / "job"
    if message is not None:
        with pytest.raises(ConfigError) as e:
            generate(str(sweep), out, JobOptions())
        assert message in str(e.value)
        assert not out.exists()
        return
    generate(str(sweep), out, JobOptions())
    for script in list(out.glob("*.sbatch")) + [out / "submit.sh"]:
        _inspect(script, value)
        text = script.read_bytes().decode()
        assert "PWNED" not in text and "outside" not in text
    sw = load_sweep(out / "sweep.toml", out=str(out / "results"))
    for pt in sw.points:  # every result file stays inside the results folder
        assert pt.path.parent == out / "results"
        assert pt.path.resolve().parent == (out / "results").resolve()
        assert len(pt.path.name.encode()) <= 255 and "\n" not in pt.path.name
    _run_scripts(out, tmp_path)
    assert not list(tmp_path.rglob("PWNED")) and not (tmp_path / "outside").exists()


def test_grid_values_become_safe_file_names(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(
        SWEEP.format(**GOOD).replace(
            "[grid]", '[grid]\ntag = ["../../x", "a/b", "..", "$(id)", "a b"]'
        )
    )
    sw = load_sweep(f, out=str(tmp_path / "res"))
    names = [p.path.name for p in sw.points]
    assert len(set(names)) == len(names) == 5
    for p in sw.points:
        assert p.path.parent == tmp_path / "res" and "/" not in p.label and ".." not in p.label


def test_cli_refuses_hostile_options_with_exit_2(tmp_path, capsys):
    sweep = _sweep_file(tmp_path)
    out = str(tmp_path / "job")
    for flag, value in [
        ("--mpi", "pmi2; touch X"),
        ("--partition", "gpu\ntouch X"),
        ("--time", "1:00:00\ntouch X"),
        ("--account", "my proj"),
        ("--nodes", "-1"),
    ]:
        assert main(["jobs", "generate", str(sweep), "--out", out, flag, value]) == 2
        err = capsys.readouterr().err
        assert flag in err and "Traceback" not in err
    assert not Path(out).exists()
    valid = ["--time", "2-12:30:00", "--partition", "cpu,gpu", "--account", "proj_1", "--mpi"]
    assert main(["jobs", "generate", str(sweep), "--out", out, *valid, "pmix_v4"]) == 0
    text = (Path(out) / "array-2.sbatch").read_bytes().decode()
    assert "#SBATCH --time=2-12:30:00" in text and "srun --mpi=pmix_v4 " in text
