"""Job scripts: generated, syntax-checked, and run on a real (local) Slurm.

The Slurm tests need a controller (CI starts one with .ci/slurm.sh). Without
one they are skipped with the reason — unless HPCPIPE_REQUIRE_SLURM=1 (set by
CI), where a missing Slurm fails them.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcpipe.run.config import ConfigError
from hpcpipe.run.results import load
from hpcpipe.studies.jobs import JobOptions, generate

HERE = Path(__file__).parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

SMALL = """
[sweep]
name = "smooth"
ranks = "depth"
[base]
tag = "smooth"
problem = "quad-chain"
optimizer = "agd"
mode = "theory"
dim = 32
progress = "off"
[grid]
depth = [1, 2, 3]
epsilon = [1e-3]
"""

LONG = """
[sweep]
name = "long"
ranks = 2
[base]
problem = "l1-chain"
depth = 2
dim = 8
optimizer = "gd"
lr = 0.01
iterations = 400
layer_time = 0.002
flush_every = 5
progress = "off"
"""


def slurm_available() -> str | None:
    if not shutil.which("sbatch"):
        return "sbatch not found"
    p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=ENV)
    if p.returncode != 0 or not re.search(r"idle|mix|alloc", p.stdout):
        return f"no responsive Slurm controller (sinfo: {p.stdout.strip()} {p.stderr.strip()})"
    return None


def need_slurm():
    why = slurm_available()
    if why is None:
        return
    if os.environ.get("HPCPIPE_REQUIRE_SLURM") == "1":
        pytest.fail(f"HPCPIPE_REQUIRE_SLURM=1 but {why}; start one with .ci/slurm.sh start DIR")
    pytest.skip(f"{why}; run .ci/slurm.sh start DIR and export SLURM_CONF to test with Slurm")


def test_generated_scripts_are_plain_and_portable(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(SMALL)
    files = generate(
        str(sweep),
        tmp_path / "jobs",
        JobOptions(partition="batch", account="proj1", time="00:10:00"),
    )
    names = sorted(f.name for f in files)
    assert names == [
        "README.txt",
        "analysis.sbatch",
        "array-1.sbatch",
        "array-2.sbatch",
        "array-3.sbatch",
        "grid.json",
        "submit.sh",
        "sweep.toml",
    ]
    for f in files:
        if f.suffix in (".sbatch", ".sh"):
            assert subprocess.run(["bash", "-n", str(f)]).returncode == 0, f
            text = f.read_text()
            # no path of this machine: not the checkout, the temp dir, a home or a venv
            for bad in (str(HERE.parent), str(tmp_path), os.path.expanduser("~"), sys.prefix):
                assert bad not in text, (f, bad)
            assert not re.search(r"(^|\s)/(home|work|root|tmp)/", text), f
    arr = (tmp_path / "jobs" / "array-2.sbatch").read_text()
    assert "#SBATCH --array=1" in arr and "#SBATCH --ntasks=2" in arr
    assert "#SBATCH --partition=batch" in arr and "#SBATCH --account=proj1" in arr
    assert "srun --mpi=pmi2" in arr and '--point "$SLURM_ARRAY_TASK_ID"' in arr
    sub = (tmp_path / "jobs" / "submit.sh").read_text()
    assert "--dependency=afterany" in sub  # a timed-out (resumable) task still gets a report
    mp = generate(str(sweep), tmp_path / "j2", JobOptions(launcher="mpiexec"))
    assert any('"$mpiexec" -n 2 ' in f.read_text() for f in mp if f.suffix == ".sbatch")


def test_generated_multinode_placement_and_script_fixes(tmp_path):
    """Placement options go to the arrays only; mpiexec is the one next to the job's Python
    (never a bare `mpiexec`), the job's task count is kept for the result file, --module and
    --signal are written, logs/ exists, and the analysis lists every point's state first."""
    sweep = tmp_path / "s.toml"
    sweep.write_text(SMALL)
    opts = JobOptions(
        nodes=2,
        tasks_per_node=2,
        sharing="exclusive",
        launcher="mpiexec",
        python="/opt/py/bin/python",
        modules=("gcc/12.2", "mpich"),
        signal=120,
    )
    folder = tmp_path / "jobs"
    generate(str(sweep), folder, opts)
    arr = (folder / "array-2.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --exclusive",
                 "#SBATCH --signal=B:TERM@120", "module load gcc/12.2\nmodule load mpich",
                 'export HPCPIPE_SLURM_NTASKS="$SLURM_NTASKS"', '"$mpiexec" -n 2 ',
                 'HPCPIPE_SLURM_TASKS_PER_NODE="${SLURM_TASKS_PER_NODE:-}"',
                 "/opt/py/bin/python -c 'import sys; sys.path[:1] = [p for p in sys.path[:1] "
                 "if p]; from hpcpipe.cli.launch import find_mpiexec",
                 "mkdir -p logs results"):  # fmt: skip
        assert line in arr, (line, arr)
    assert not re.search(r"^\s*mpiexec ", arr, re.M), arr
    assert subprocess.run(["bash", "-n", str(folder / "array-2.sbatch")]).returncode == 0
    ana = (folder / "analysis.sbatch").read_text()
    assert "--nodes" not in ana and "--ntasks-per-node" not in ana and "--exclusive" not in ana
    assert ana.index("sweep sweep.toml --out results --list") < ana.index("analyze results")
    assert (folder / "logs").is_dir()
    srun = generate(str(sweep), tmp_path / "j2", JobOptions(signal=60, sharing="shared"))
    text = next(f for f in srun if f.name == "array-1.sbatch").read_text()
    assert "#SBATCH --signal=TERM@60" in text and "#SBATCH --oversubscribe" in text
    for bad in (JobOptions(modules=("gcc; rm -rf /",)), JobOptions(signal=-1)):
        with pytest.raises(ConfigError):
            generate(str(sweep), tmp_path / "bad", bad)
    assert not (tmp_path / "bad").exists()


SHIPPED = {"depth-mpi": "depth-mpi", "dimension": "dimension", "depth-wall": "depth-wall-cluster"}


@pytest.mark.parametrize("study", sorted(SHIPPED))
def test_shipped_job_folders_are_what_the_generator_writes(study, tmp_path):
    """jobs/slurm/<study> is what `hpcpipe jobs generate` writes for its sweep file
    (jobs/sweeps/<study>.toml; the depth-wall folder: depth-wall-cluster.toml)."""
    shipped = HERE.parent / "jobs" / "slurm" / study
    sweep = SHIPPED[study]
    files = generate(str(HERE.parent / "jobs" / "sweeps" / f"{sweep}.toml"), tmp_path, JobOptions())
    names = sorted(str(f.relative_to(tmp_path)) for f in files)
    assert sorted(str(p.relative_to(shipped)) for p in shipped.rglob("*") if p.is_file()) == names
    for f in files:
        assert (shipped / f.relative_to(tmp_path)).read_text() == f.read_text(), (
            f"jobs/slurm/{study}/{f.name} is stale: run "
            f"hpcpipe jobs generate jobs/sweeps/{sweep}.toml --out jobs/slurm/{study}"
        )
        if f.suffix in (".sbatch", ".sh"):
            assert subprocess.run(["bash", "-n", str(shipped / f.name)]).returncode == 0


def _submit(folder: Path) -> list[str]:
    p = subprocess.run([str(folder / "submit.sh")], capture_output=True, text=True, env=ENV)
    assert p.returncode == 0, p.stdout + p.stderr
    return (folder / "submitted.txt").read_text().split()


def _wait(ids: list[str], timeout: float = 300) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        q = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"],
            capture_output=True,
            text=True,
            env=ENV,
        )
        if not q.stdout.strip():
            return
        time.sleep(1)
    subprocess.run(["scancel", *ids], env=ENV)
    raise AssertionError(f"jobs {ids} still queued after {timeout} s")


@pytest.fixture
def jobdir(tmp_path):
    need_slurm()
    return tmp_path


def test_array_and_dependent_analysis_on_slurm(jobdir):
    sweep = jobdir / "s.toml"
    sweep.write_text(SMALL)
    folder = jobdir / "jobs"
    generate(str(sweep), folder, JobOptions(python=sys.executable, time="00:10:00"))
    ids = _submit(folder)
    _wait(ids)
    for i, depth in enumerate([1, 2, 3]):
        f = folder / "results" / f"{i:04d}-depth={depth}-epsilon=0.001.h5"
        r = load(f)
        assert r.status == "complete", f
        slurm = __import__("json").loads(r.attrs["slurm"])
        assert slurm["SLURM_ARRAY_TASK_ID"] == str(i) and int(slurm["SLURM_NTASKS"]) == depth
        assert r.attrs["n_ranks"] == depth
    report = (folder / "report" / "report.md").read_text()
    assert "| smooth |" in report and "VIOLATED" not in report
    logs = list((folder / "logs").glob("*analysis*.out"))
    assert logs and "wrote report/report.md" in logs[0].read_text()


def test_cancelled_task_leaves_incomplete_file_and_resubmit_finishes(jobdir):
    sweep = jobdir / "long.toml"
    sweep.write_text(LONG)
    folder = jobdir / "jobs"
    generate(str(sweep), folder, JobOptions(python=sys.executable, time="00:10:00"))
    (folder / "logs").mkdir(exist_ok=True)  # generate ships it; a hand-made one is fine too
    out = subprocess.run(
        ["sbatch", "--parsable", "array-2.sbatch"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    f = folder / "results" / "0000-point.h5"
    t0 = time.time()
    while time.time() - t0 < 120:
        try:
            if len(load(f).iterations["iteration"]) >= 10:
                break
        except Exception:
            pass
        time.sleep(0.2)
    else:
        subprocess.run(["scancel", job], env=ENV)
        raise AssertionError("the task never wrote 10 iterations")
    subprocess.run(["scancel", "--signal=TERM", f"{job}_0"], check=True, env=ENV)
    _wait([job])
    r = load(f)
    assert r.status == "incomplete"
    n = len(r.iterations["iteration"])
    assert 10 <= n < 400
    ids = _submit(folder)  # resubmit the same array (and its analysis)
    _wait(ids)
    r = load(f)
    assert r.status == "complete" and int(r.attrs["resumed"]) == 1
    assert r.iterations["iteration"].tolist() == list(range(1, 401))


def test_shipped_single_run_script(jobdir):
    script = HERE.parent / "jobs" / "pprs-run.sbatch"
    env = dict(ENV, PATH=f"{Path(sys.executable).parent}{os.pathsep}{ENV['PATH']}")
    p = subprocess.run(
        ["sbatch", "--wait", "--parsable", str(script)],
        cwd=jobdir,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    job = p.stdout.strip().split(";")[0]
    r = load(jobdir / f"pprs-run-{job}.h5")
    assert r.status == "complete" and r.config["optimizer"] == "pprs"
    assert len(r.iterations["iteration"]) == 200
    assert __import__("json").loads(r.attrs["slurm"])["SLURM_JOB_ID"] == job
