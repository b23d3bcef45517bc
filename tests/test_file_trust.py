"""A result file never makes hpcpipe run code: a ``package.module:attribute`` that a file
records is imported on ``--resume`` only when the user names it again (or ``--trust-file``),
never by ``analyze`` (unless ``--trust-file``), and the ranks and the generated batch scripts
start Python without the working folder on the import path.

Each attack plants a module that, when imported, writes a marker file; a control run shows
that the planted module is really reachable, so a missing marker means nothing imported it.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from mpi4py import MPI

from hpcpipe.run.config import make_config
from hpcpipe.run.results import load
from hpcpipe.run.runner import run

SMALL = dict(problem="l1-chain", depth=2, dim=8, optimizer="gd", lr=0.05, progress="off")
PLANT = "import os, pathlib\npathlib.Path(os.environ['MARK']).write_text(__name__)\n"


def _console() -> list[str]:
    """The installed ``hpcpipe`` command (what a user types), else the interpreter's -P form."""
    exe = Path(sys.executable).parent / "hpcpipe"
    return [str(exe)] if exe.exists() else [sys.executable, "-P", "-m", "hpcpipe"]


@pytest.fixture
def plant(tmp_path):
    """A working folder holding a planted ``evilmod.py`` and ``h5py.py``, and ``evilmod.py``
    on PYTHONPATH too (each writes MARK when imported)."""
    work, lib = tmp_path / "work", tmp_path / "lib"
    for d in (work, lib):
        d.mkdir()
        (d / "evilmod.py").write_text(
            PLANT + "def lifo(n_stages, n_items):\n    raise SystemExit\n"
        )
    (work / "h5py.py").write_text(PLANT)
    mark = tmp_path / "imported"
    env = dict(os.environ, MARK=str(mark), PYTHONPATH=str(lib), OMP_NUM_THREADS="1")
    return work, mark, env


def _recorded(path: Path, **config) -> Path:
    """A result file whose recorded config is changed to ``config`` (as a sender could)."""
    with h5py.File(path, "r+") as f:
        values = json.loads(f.attrs["config"])
        values.update(config)
        f.attrs["config"] = json.dumps(values)
    return path


def _incomplete(path: Path) -> Path:
    cfg = make_config({**SMALL, "iterations": 20, "flush_every": 3, "output": str(path)})

    def hook(row):
        if row[0] == 6:
            os.kill(os.getpid(), signal.SIGTERM)

    run(cfg, MPI.COMM_SELF, on_iteration=hook)
    assert load(path).status == "incomplete"
    return path


def _hpcpipe(cwd: Path, env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_console(), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_line(p: subprocess.CompletedProcess, *words: str) -> None:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("key", ["schedule", "problem", "optimizer", "executor"])
def test_resume_refuses_a_recorded_module_and_imports_nothing(tmp_path, plant, key):
    work, mark, env = plant
    f = _recorded(_incomplete(tmp_path / "r.h5"), **{key: "evilmod:lifo"})
    before = f.read_bytes()
    p = _hpcpipe(work, env, "run", "--resume", f, "--np", "2")
    _one_line(p, f"{key} 'evilmod:lifo' is recorded in {f}", f"--{key} evilmod:lifo")
    assert not mark.exists() and f.read_bytes() == before
    # control: named again on the command line, the user's choice is imported
    _hpcpipe(work, env, "run", "--resume", f, f"--{key}", "evilmod:lifo")
    assert mark.read_text() == "evilmod"


def test_resume_refuses_builtins_print_and_trust_file_lifts_it(tmp_path, plant):
    work, mark, env = plant
    f = _recorded(_incomplete(tmp_path / "r.h5"), schedule="builtins:print")
    p = _hpcpipe(work, env, "run", "--resume", f, "--np", "2")
    _one_line(p, "schedule 'builtins:print' is recorded in", "--trust-file")
    assert p.stdout == ""  # print never ran
    g = _recorded(_incomplete(tmp_path / "g.h5"), schedule="evilmod:lifo")
    _hpcpipe(work, env, "run", "--resume", g, "--trust-file")
    assert mark.read_text() == "evilmod"  # --trust-file imports what the file names


def test_analyze_imports_no_module_a_result_names(tmp_path, plant):
    work, mark, env = plant
    res = tmp_path / "results"
    res.mkdir()
    cfg = make_config({**SMALL, "iterations": 5, "tag": "pipeline-time", "output": ""})
    out = res / "a.h5"
    run(make_config({**cfg.__dict__, "output": str(out)}), MPI.COMM_SELF)
    _recorded(out, schedule="evilmod:lifo")
    p = _hpcpipe(work, env, "analyze", res, "-o", tmp_path / "report")
    assert "Traceback" not in p.stderr and not mark.exists(), p.stderr
    # control: the study does look the schedule up, so --trust-file imports it
    _hpcpipe(work, env, "analyze", res, "-o", tmp_path / "report2", "--trust-file")
    assert mark.read_text() == "evilmod"


def test_ranks_do_not_import_modules_from_the_working_folder(tmp_path, plant):
    work, mark, env = plant
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}  # only the working folder
    p = _hpcpipe(work, env, "run", "--np", "2", *_flags(SMALL), "--iterations", "2", "--no-output")
    assert p.returncode == 0 and not mark.exists(), p.stderr
    # control: a plain `python -c "import h5py"` there imports the planted file
    subprocess.run([sys.executable, "-c", "import h5py"], cwd=work, env=env, check=True)
    assert mark.read_text() == "h5py"


def test_generated_batch_scripts_start_python_off_the_working_folder(tmp_path, plant):
    from hpcpipe.studies.jobs import JobOptions, array_script
    from hpcpipe.studies.sweep import load_sweep

    work, mark, env = plant
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    sweep = tmp_path / "s.toml"
    sweep.write_text('[sweep]\nname = "s"\n[base]\nproblem = "l1-chain"\n[grid]\nlr = [0.1]\n')
    script = array_script(load_sweep(str(sweep)), 1, [0], JobOptions(python=sys.executable))
    start = next(line for line in script.splitlines() if line.startswith("hpcpipe=("))
    p = subprocess.run(
        ["bash", "-c", f'{start}\n"${{hpcpipe[@]}}" info'],  # info imports h5py
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and p.stdout.startswith("hpcpipe "), p.stderr
    assert "h5py" in p.stdout and not mark.exists()


def _flags(values: dict) -> list[str]:
    return [w for k, v in values.items() for w in (f"--{k}", str(v))]
