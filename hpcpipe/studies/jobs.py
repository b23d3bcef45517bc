"""Slurm batch scripts for a sweep: job arrays per rank count, and a dependent analysis job.

``hpcpipe jobs generate SWEEP.toml --out DIR`` writes into DIR:

* ``sweep.toml``       a copy of the sweep, and ``grid.json``, the resolved grid;
* ``array-R.sbatch``   one job array per distinct rank count R, whose tasks run
                       the grid points needing R ranks (``SLURM_ARRAY_TASK_ID`` is the
                       point index), each asking for R tasks;
* ``analysis.sbatch``  the state of every point, then the report, run once every
                       array task has ended (a task stopped at its time limit included);
* ``calibrate-R.sbatch`` when the sweep's points of R ranks name machine profiles
                       (``machine =``): calibrates the missing ones on an allocation
                       of the same shape (R tasks, the same placement options), so
                       that the profiles are this cluster's; a made profile is kept;
* ``submit.sh``        submits the calibrations, each array after its rank count's
                       calibration (``--dependency=afterok``), then the analysis with
                       ``--dependency=afterany:<arrays>``.

A sweep that names profiles is checked point by point without reading them (they are
made by the calibration jobs); everything else is checked before a file is written.

Everything is relative to DIR (results in ``DIR/results``, logs in ``DIR/logs``,
the report in ``DIR/report``), so the folder can be copied to a cluster as is.
Slurm opens a job's ``--output`` file before its script runs, so ``logs/`` is made
when the folder is written (and by ``submit.sh``, and by each script for the next).
Re-running ``submit.sh`` skips complete points and resumes incomplete ones.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.cli.launch import FIND_MPIEXEC, SAFE_MAIN, SAFE_PATH
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
_MODULE = re.compile(r"[A-Za-z0-9_.+-]{1,128}(?:/[A-Za-z0-9_.+-]{1,128}){0,4}")
SHARING = ("", "exclusive", "shared")


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
    sharing: str = ""  # "exclusive": whole nodes; "shared": nodes shared with other jobs
    modules: tuple[str, ...] = ()  # `module load` in every script, in order
    signal: int = 0  # seconds before the time limit at which the ranks get SIGTERM (0: none)


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
    if opts.sharing not in SHARING:
        raise ConfigError(f"--{opts.sharing!r}: choose --exclusive or --shared")
    for module in opts.modules:
        if not _MODULE.fullmatch(module):
            raise ConfigError(
                f"--module {module!r}: a module name such as gcc/12.2 (letters, digits, "
                "_ . + -, parts separated by /)"
            )
    s = opts.signal
    if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= 65535:
        raise ConfigError(f"--signal {s!r}: seconds before the time limit, 0..65535 (0: none)")
    for name in ("python", "activate"):  # shlex.quote'd; a control character is refused
        value = getattr(opts, name)
        if any(ord(c) < 32 or ord(c) == 127 for c in value) or (name == "python" and not value):
            raise ConfigError(
                f"--{name} {value!r}: a path without control characters (newlines, tabs) is needed"
            )


def _header(name: str, opts: JobOptions, extra: list[str], placed: bool = True) -> list[str]:
    """#SBATCH lines; ``placed``: the MPI job's placement (nodes, tasks per node, sharing)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name):  # sweep names are checked on load
        raise ConfigError(f"job name {name!r}: letters, digits, _ . - only")
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --time={opts.time}"]
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    if placed and opts.nodes:
        lines.append(f"#SBATCH --nodes={opts.nodes}")
    if placed and opts.tasks_per_node:
        lines.append(f"#SBATCH --ntasks-per-node={opts.tasks_per_node}")
    if placed and opts.sharing == "exclusive":
        lines.append("#SBATCH --exclusive")
    if placed and opts.sharing == "shared":
        lines.append("#SBATCH --oversubscribe")
    if opts.overcommit:
        lines.append("#SBATCH --overcommit")
    return lines + [f"#SBATCH {e}" for e in extra]


def _prologue(opts: JobOptions) -> list[str]:
    lines = ["set -euo pipefail", 'cd "${SLURM_SUBMIT_DIR:-$(pwd)}"', "mkdir -p logs results"]
    lines += [f"module load {m}" for m in opts.modules]
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
    py = shlex.quote(opts.python)
    run = '"${hpcpipe[@]}" sweep sweep.toml --out results --point "$SLURM_ARRAY_TASK_ID" --inside'
    extra = [
        f"--array={','.join(map(str, indices))}",
        f"--ntasks={ranks}",
        "--output=logs/%x-%A_%a.out",
    ]
    if opts.launcher == "srun":
        if opts.signal:  # to every job step: srun passes it on to the ranks
            extra.append(f"--signal=TERM@{opts.signal}")
        launch = [f"srun --mpi={opts.mpi} {run}"]
    else:
        if opts.signal:  # to the batch shell, which passes it on to mpiexec (below)
            extra.append(f"--signal=B:TERM@{opts.signal}")
        # the mpiexec next to the Python that has hpcpipe (a venv's, the wheel's), else PATH's;
        # hydra's proxies see the task layout of their own step (one task per node): the
        # job's is kept for the result file
        launch = [
            f"mpiexec=$({py} -c {shlex.quote(SAFE_PATH + FIND_MPIEXEC)})",
            'export HPCPIPE_SLURM_NTASKS="$SLURM_NTASKS"'
            ' HPCPIPE_SLURM_TASKS_PER_NODE="${SLURM_TASKS_PER_NODE:-}"',
            f'"$mpiexec" -n {ranks} {run} &',
            "pid=$!",
            "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM",
            'wait "$pid" && status=0 || status=$?',
            "# after SIGTERM: wait again while the ranks flush, and keep mpiexec's status",
            'if [ "$status" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then',
            '  wait "$pid" && status=0 || status=$?',
            "fi",
            'exit "$status"',
        ]
    lines = _header(f"hpcpipe-{sweep.name}-r{ranks}", opts, extra)
    lines += [
        f"# generated by `hpcpipe jobs generate` from {Path(sweep.source).name}:",
        f"# {len(indices)} grid points of {ranks} ranks each (see grid.json)",
    ]
    lines += _prologue(opts)
    lines += [
        "# SIGTERM (time limit, scancel) reaches the ranks: they flush the point's HDF5",
        "# file, mark it incomplete and exit 143; submitting again resumes it.",
        *launch,
        "",
    ]
    return "\n".join(lines)


def calibration_script(sweep: Sweep, ranks: int, todo: list, opts: JobOptions) -> str:
    """The job that calibrates the machine profiles ``todo`` (``sweep_profiles.Need``, all
    of ``ranks`` ranks) on an allocation of the arrays' shape; an existing one is kept."""
    py = shlex.quote(opts.python)
    lines = _header(
        f"hpcpipe-{sweep.name}-calibrate-r{ranks}",
        opts,
        [f"--ntasks={ranks}", "--output=logs/%x-%j.out"],
    )
    lines += [
        f"# generated by `hpcpipe jobs generate` from {Path(sweep.source).name}: the machine",
        f"# profiles its points of {ranks} ranks name, measured on this allocation (docs:",
        "# docs/how-to/calibration.md); submit.sh starts their array once this job succeeds.",
    ]
    lines += _prologue(opts)
    lines.append("export HPCPIPE_INSIDE_MPI=1  # the ranks calibrate; no launch of their own")
    if opts.launcher == "mpiexec":
        lines.append(f"mpiexec=$({py} -c {shlex.quote(SAFE_PATH + FIND_MPIEXEC)})")
    for need in todo:
        path = shlex.quote(need.path)
        cmd = '"${hpcpipe[@]}" ' + " ".join(shlex.quote(a) for a in need.argv([]))
        if opts.launcher == "srun":
            launch = f"srun --mpi={opts.mpi} {cmd}"
        else:
            launch = f'"$mpiexec" -n {ranks} {cmd}'
        lines += [
            f"if [ -f {path} ]; then",
            f'  echo "kept {need.path} (delete it to calibrate again)"',
            "else",
            f'  mkdir -p "$(dirname {path})"',
            f"  {launch}",
            "fi",
        ]
    lines.append("")
    return "\n".join(lines)


def analysis_script(sweep: Sweep, opts: JobOptions) -> str:
    lines = _header(
        f"hpcpipe-{sweep.name}-analysis",
        opts,
        ["--ntasks=1", "--output=logs/%x-%j.out"],
        placed=False,
    )
    lines += [
        "# generated by `hpcpipe jobs generate`: the report of the sweep, once every",
        "# array task has ended (submit.sh sets --dependency=afterany): first the state",
        "# of every point (complete, incomplete: resubmit to resume, failed, missing).",
    ]
    lines += _prologue(opts)
    lines += [
        '"${hpcpipe[@]}" sweep sweep.toml --out results --list',
        '"${hpcpipe[@]}" analyze results -o report',
        "",
    ]
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
aid=$(sbatch --parsable --dependency=afterany:"$dep" analysis.sbatch)
echo "submitted analysis.sbatch as job ${{aid%%;*}} (after $dep)"
echo "${{ids[*]}} ${{aid%%;*}}" > submitted.txt
"""


SUBMIT_CALIBRATED = """#!/bin/bash
# generated by `hpcpipe jobs generate`: calibrate the machine profiles the sweep names,
# submit each array once its rank count's calibration succeeded, then the analysis.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p logs results
ids=()
submit() {{  # submit SCRIPT [DEPENDENCY]: its job id in $id
  if [ -n "${{2:-}}" ]; then
    id=$(sbatch --parsable --dependency="$2" "$1")
  else
    id=$(sbatch --parsable "$1")
  fi
  id=${{id%%;*}}
  echo "submitted $1 as job $id${{2:+ ($2)}}"
}}
{steps}
dep=$(IFS=:; echo "${{ids[*]}}")
aid=$(sbatch --parsable --dependency=afterany:"$dep" analysis.sbatch)
echo "submitted analysis.sbatch as job ${{aid%%;*}} (after $dep)"
echo "${{ids[*]}} ${{aid%%;*}}" > submitted.txt
"""


LOGS = """The jobs' output (#SBATCH --output=logs/...). Slurm opens it before a job's script
runs, so this folder must exist when a script is submitted, by submit.sh or by hand.
"""


def _check_profile_path(path: str) -> None:
    """A profile a Slurm folder calibrates lies inside the folder: a relative path without
    ``..`` (the jobs run in the folder, which is copied to the cluster as is)."""
    p = Path(path)
    if p.is_absolute() or ".." in p.parts or any(ord(c) < 32 for c in path):
        raise ConfigError(
            f"machine = {path!r}: a Slurm folder calibrates its profiles inside itself; "
            "give a relative path without .. (e.g. profiles/machine-np16.toml)"
        )


def generate(sweep_path: str, out: str | Path, opts: JobOptions) -> list[Path]:
    """Write the job folder; returns the files written.

    Every option and every sweep field is checked before anything is written.
    """
    from hpcpipe.machine.sweep_profiles import named

    check_options(opts)
    profiles = named(str(sweep_path))  # made by the calibration jobs, not read here
    for need in profiles:
        _check_profile_path(need.path)
    # the sweep must be valid before the folder is made
    load_sweep(sweep_path, profiles=not profiles)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sweep_path, out / "sweep.toml")
    sweep = load_sweep(out / "sweep.toml", out=str(out / "results"), profiles=not profiles)
    sweep.source = "sweep.toml"  # relative to the folder, like every path in it
    groups: dict[int, list[int]] = defaultdict(list)
    for p in sweep.points:
        groups[p.ranks].append(p.index)
    files = [write_grid(sweep)]
    grid = out / "grid.json"
    shutil.move(str(files[0]), grid)
    files = [out / "sweep.toml", grid]
    scripts, steps = [], []
    for ranks, idx in sorted(groups.items()):
        todo = [n for n in profiles if n.ranks == ranks]
        if todo:
            f = out / f"calibrate-{ranks}.sbatch"
            f.write_text(calibration_script(sweep, ranks, todo, opts))
            files.append(f)
            steps += [f"submit {f.name}", f'submit array-{ranks}.sbatch afterok:"$id"']
        else:
            steps.append(f"submit array-{ranks}.sbatch")
        steps.append('ids+=("$id")')
        f = out / f"array-{ranks}.sbatch"
        f.write_text(array_script(sweep, ranks, idx, opts))
        scripts.append(f.name)
        files.append(f)
    f = out / "analysis.sbatch"
    f.write_text(analysis_script(sweep, opts))
    files.append(f)
    # Slurm opens --output=logs/... before a script runs: the folder ships with the scripts
    f = out / "logs" / "README.txt"
    f.parent.mkdir(exist_ok=True)
    f.write_text(LOGS)
    files.append(f)
    f = out / "submit.sh"
    if profiles:
        f.write_text(SUBMIT_CALIBRATED.format(steps="\n".join(steps)))
    else:
        f.write_text(SUBMIT.format(scripts=" ".join(scripts)))
    f.chmod(0o755)
    files.append(f)
    return files
