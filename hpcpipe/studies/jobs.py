"""Slurm batch scripts for a sweep: job arrays per rank count, and a dependent analysis job.

``hpcpipe jobs generate SWEEP.toml --out DIR`` writes into DIR:

* ``sweep.toml``       a copy of the sweep, and ``grid.json``, the resolved grid;
* ``array-R.sbatch``   one job array per distinct rank count R, whose tasks run
                       the grid points needing R ranks (``SLURM_ARRAY_TASK_ID`` is the
                       point index), each asking for R tasks;
* ``analysis.sbatch``  the report, run after every array succeeded;
* ``submit.sh``        submits the arrays, then the analysis with
                       ``--dependency=afterok:<arrays>``.

Everything is relative to DIR (results in ``DIR/results``, logs in ``DIR/logs``,
the report in ``DIR/report``), so the folder can be copied to a cluster as is.
Re-running ``submit.sh`` skips complete points and resumes incomplete ones.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.cli.launch import SAFE_MAIN
from hpcpipe.run.config import ConfigError
from hpcpipe.studies.sweep import Sweep, load_sweep, write_grid

LAUNCHERS = ("srun", "mpiexec")

# Slurm's own syntax (sbatch(1) --time, slurm.conf PartitionName, sacctmgr account names,
# srun --mpi plugin types). Values written into #SBATCH lines or an unquoted command word
# must match these; everything else is shlex.quote'd.
_TIME = re.compile(
    r"(?:[0-9]+|[0-9]+:[0-9]{1,2}|[0-9]+:[0-9]{1,2}:[0-9]{1,2}"
    r"|[0-9]+-[0-9]{1,2}(?::[0-9]{1,2}){0,2}|UNLIMITED|INFINITE)"
)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SYNTAX = {
    "time": (_TIME, "MINUTES, MM:SS, HH:MM:SS, DAYS-HH, DAYS-HH:MM[:SS] or UNLIMITED"),
    "partition": (
        re.compile(r"[A-Za-z0-9_.-]{1,64}(?:,[A-Za-z0-9_.-]{1,64})*"),
        "a partition name (letters, digits, _ . -), or several separated by commas",
    ),
    "account": (_NAME, "an account name (letters, digits, _ . -)"),
    "mpi": (re.compile(r"[A-Za-z0-9_]{1,32}"), "an srun --mpi plugin type, e.g. pmi2, pmix"),
}


@dataclass
class JobOptions:
    partition: str = ""
    account: str = ""
    time: str = "01:00:00"
    nodes: int = 0
    tasks_per_node: int = 0
    launcher: str = "srun"
    mpi: str = "pmi2"  # srun --mpi plugin (the mpich wheel has PMI2, not PMIx)
    python: str = "python3"
    activate: str = ""  # a virtual environment to activate in the job
    overcommit: bool = False  # more tasks than cores (small test clusters)


def check_options(opts: JobOptions) -> None:
    """Refuse any option that is not in Slurm's own syntax (ConfigError naming the option)."""
    if opts.launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher {opts.launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    for name, (pattern, allowed) in SYNTAX.items():
        value = getattr(opts, name)
        if (value or name in ("time", "mpi")) and not pattern.fullmatch(value):
            raise ConfigError(f"--{name} {value!r} is not valid Slurm syntax: write {allowed}")
    for name in ("nodes", "tasks_per_node"):
        value = getattr(opts, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1_000_000:
            flag = "--" + name.replace("_", "-").replace("tasks", "ntasks")
            raise ConfigError(f"{flag} {value!r}: expected a whole number >= 0 (0: unset)")
    for name in ("python", "activate"):  # shlex.quote'd; a control character is refused
        value = getattr(opts, name)
        if any(ord(c) < 32 or ord(c) == 127 for c in value) or (name == "python" and not value):
            raise ConfigError(
                f"--{name} {value!r}: a path without control characters (newlines, tabs) is needed"
            )


def _header(name: str, opts: JobOptions, extra: list[str]) -> list[str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name):  # sweep names are checked on load
        raise ConfigError(f"job name {name!r}: letters, digits, _ . - only")
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --time={opts.time}"]
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    if opts.nodes:
        lines.append(f"#SBATCH --nodes={opts.nodes}")
    if opts.tasks_per_node:
        lines.append(f"#SBATCH --ntasks-per-node={opts.tasks_per_node}")
    if opts.overcommit:
        lines.append("#SBATCH --overcommit")
    return lines + [f"#SBATCH {e}" for e in extra]


def _prologue(opts: JobOptions) -> list[str]:
    lines = ["set -euo pipefail", 'cd "${SLURM_SUBMIT_DIR:-$(pwd)}"']
    if opts.activate:
        lines.append(f". {shlex.quote(opts.activate)}/bin/activate")
    lines += [
        "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1",
        "# hpcpipe, with the working folder off Python's import path (python -m would put it",
        "# first, and a module file there, such as h5py.py, would run in every rank)",
        f"hpcpipe=({shlex.quote(opts.python)} -c {shlex.quote(SAFE_MAIN)})",
        'echo "job ${SLURM_JOB_ID:-?} task ${SLURM_ARRAY_TASK_ID:-?} on '
        '${SLURM_JOB_NODELIST:-?}: ${SLURM_NTASKS:-?} tasks"',
    ]
    return lines


def array_script(sweep: Sweep, ranks: int, indices: list[int], opts: JobOptions) -> str:
    run = '"${hpcpipe[@]}" sweep sweep.toml --out results --point "$SLURM_ARRAY_TASK_ID" --inside'
    if opts.launcher == "srun":
        launch = f"srun --mpi={opts.mpi} {run}"
    else:
        launch = f'mpiexec -n "$SLURM_NTASKS" {run}'
    lines = _header(
        f"hpcpipe-{sweep.name}-r{ranks}",
        opts,
        [
            f"--array={','.join(map(str, indices))}",
            f"--ntasks={ranks}",
            "--output=logs/%x-%A_%a.out",
        ],
    )
    lines += [
        f"# generated by `hpcpipe jobs generate` from {Path(sweep.source).name}:",
        f"# {len(indices)} grid points of {ranks} ranks each (see grid.json)",
    ]
    lines += _prologue(opts)
    lines += [
        "# SIGTERM (time limit, scancel) reaches the ranks: they flush the point's HDF5",
        "# file, mark it incomplete and exit 143; submitting again resumes it.",
        launch,
        "",
    ]
    return "\n".join(lines)


def analysis_script(sweep: Sweep, opts: JobOptions) -> str:
    lines = _header(
        f"hpcpipe-{sweep.name}-analysis", opts, ["--ntasks=1", "--output=logs/%x-%j.out"]
    )
    lines += [
        "# generated by `hpcpipe jobs generate`: the report of the sweep, once every",
        "# array task succeeded (submit.sh sets --dependency=afterok).",
    ]
    lines += _prologue(opts)
    lines += ['"${hpcpipe[@]}" analyze results -o report', ""]
    return "\n".join(lines)


SUBMIT = """#!/bin/bash
# generated by `hpcpipe jobs generate`: submit the sweep's arrays, then its analysis.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p logs results
ids=()
for script in {scripts}; do
  id=$(sbatch --parsable "$script")
  ids+=("${{id%%;*}}")
  echo "submitted $script as job ${{id%%;*}}"
done
dep=$(IFS=:; echo "${{ids[*]}}")
aid=$(sbatch --parsable --dependency=afterok:"$dep" analysis.sbatch)
echo "submitted analysis.sbatch as job ${{aid%%;*}} (after $dep)"
echo "${{ids[*]}} ${{aid%%;*}}" > submitted.txt
"""


def generate(sweep_path: str, out: str | Path, opts: JobOptions) -> list[Path]:
    """Write the job folder; returns the files written.

    Every option and every sweep field is checked before anything is written.
    """
    check_options(opts)
    load_sweep(sweep_path)  # the sweep must be valid before the folder is made
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sweep_path, out / "sweep.toml")
    sweep = load_sweep(out / "sweep.toml", out=str(out / "results"))
    sweep.source = "sweep.toml"  # relative to the folder, like every path in it
    groups: dict[int, list[int]] = defaultdict(list)
    for p in sweep.points:
        groups[p.ranks].append(p.index)
    files = [write_grid(sweep)]
    grid = out / "grid.json"
    shutil.move(str(files[0]), grid)
    files = [out / "sweep.toml", grid]
    scripts = []
    for ranks, idx in sorted(groups.items()):
        f = out / f"array-{ranks}.sbatch"
        f.write_text(array_script(sweep, ranks, idx, opts))
        scripts.append(f.name)
        files.append(f)
    f = out / "analysis.sbatch"
    f.write_text(analysis_script(sweep, opts))
    files.append(f)
    f = out / "submit.sh"
    f.write_text(SUBMIT.format(scripts=" ".join(scripts)))
    f.chmod(0o755)
    files.append(f)
    return files
