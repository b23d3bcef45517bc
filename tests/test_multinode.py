"""MPI across nodes: a two-node cluster of network namespaces (.ci/cluster.sh), as root.

A session fixture builds the cluster (`.ci/cluster.sh up 2`) and always takes it
down. Ranks start through the MPI wheel's mpiexec with the cluster's ssh stand-in,
TCP forced between nodes (the namespaces share a kernel: without it the bytes would
go through shared memory). Without root or `ip` the tests are skipped with the
reason, unless HPCPIPE_REQUIRE_CLUSTER=1 (set by CI), where they fail.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcpipe.pipeline.placement import LinkCosts, crossings, hop_costs
from hpcpipe.pipeline.schedules import SCHEDULES, build
from hpcpipe.pipeline.simulator import simulate
from hpcpipe.run.results import load
from hpcpipe.studies.jobs import JobOptions, generate

pytestmark = pytest.mark.multinode

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / ".ci" / "cluster.sh"
PINGPONG = Path(__file__).resolve().parent / "multinode_pingpong.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", HPCPIPE_PROGRESS="off")
ENV.pop("HPCPIPE_LAUNCHER_PID", None)


def cluster_missing() -> str | None:
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("tc", "iproute2")):
        if not shutil.which(tool):
            return f"'{tool}' not found (install {package})"
    return None


def need_cluster() -> None:
    why = cluster_missing()
    if why is None:
        return
    if os.environ.get("HPCPIPE_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"HPCPIPE_REQUIRE_CLUSTER=1 but {why}")
    pytest.skip(f"{why}; run the tests as root to build the namespace cluster")


def sh(*args: str, timeout: float = 600, cwd: Path | None = None, **env: str):
    return subprocess.run(
        [str(CLUSTER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=dict(ENV, **env),
    )


@pytest.fixture(scope="session")
def cluster():
    """Two nodes n1, n2 (no rate limit; Slurm where installed); taken down whatever happens."""
    need_cluster()
    slurm = ["--slurm"] if shutil.which("slurmctld") and shutil.which("slurmd") else []
    try:
        up = sh("up", "2", *slurm, timeout=300)
        assert up.returncode == 0, up.stderr
        yield
    finally:
        down = sh("down", timeout=120)
        assert down.returncode == 0, down.stderr


def mpirun(hosts: str, ppn: int, args: list[str], cwd: Path, timeout: float = 900, **env: str):
    """``args`` run by the Python of this test on ``ppn`` ranks per host; checked."""
    p = sh("mpiexec", hosts, str(ppn), sys.executable, *args, timeout=timeout, cwd=cwd, **env)
    assert p.returncode == 0, f"{hosts} x {ppn}: {args}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def link_bytes(node: str) -> tuple[int, int]:
    """(sent, received) bytes on the node's link."""
    p = sh("bytes", node)
    assert p.returncode == 0, p.stderr
    tx, rx = (int(x) for x in p.stdout.split())
    return tx, rx


def hpcpipe_run(hosts: str, ppn: int, out: Path, *settings: str) -> None:
    args = ["-m", "hpcpipe", "run", "--output", str(out), "--progress", "off", *settings]
    mpirun(hosts, ppn, args, out.parent)


def iterate(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["state/optimizer/theta"][()]


# -- a 4-rank pipeline over 2 nodes equals the same run on one node, bit for bit ----------

DIM, ITERATIONS = 512, 40  # enough payload to stand far above the link's background traffic
METHODS = {
    "gd": ["--optimizer", "gd", "--lr", "0.05"],
    "pprs": ["--optimizer", "pprs", "--gamma", "0.05", "--samples", "3", "--lr", "0.05"],
}


@pytest.mark.parametrize(
    "schedule", [s for s in SCHEDULES.names() if build(s, 2, 2).one_stage_per_rank]
)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_nodes_equal_one_node_bitwise(cluster, tmp_path, method, schedule):
    """Iterates, losses and model-clock pipeline times of a 4-rank run with 2 ranks on each
    of n1, n2 equal those of the run with 4 ranks on n1; the cross-node run's messages
    really crossed the link (veth byte counters), the one-node run's did not; each result
    records its ranks' hosts."""
    settings = [
        "--problem", "l1-chain", "--depth", "4", "--dim", str(DIM), "--schedule", schedule,
        "--iterations", str(ITERATIONS), "--clock", "model", "--alpha", "0.5",
        "--beta", "0.001", *METHODS[method],
    ]  # fmt: skip
    one, two = tmp_path / "one-node.h5", tmp_path / "two-nodes.h5"
    before = link_bytes("n1")
    hpcpipe_run("n1", 4, one, *settings)
    middle = link_bytes("n1")
    hpcpipe_run("n1,n2", 2, two, *settings)
    after = link_bytes("n1")

    a, b = load(one), load(two)
    assert a.status == b.status == "complete"
    assert json.loads(a.attrs["rank_hosts"]) == ["n1"] * 4
    assert json.loads(b.attrs["rank_hosts"]) == ["n1", "n1", "n2", "n2"]
    assert json.loads(b.attrs["hosts"]) == ["n1", "n2"]
    for col in ("loss", "grad_norm", "pipeline_time"):
        assert np.array_equal(a.iterations[col], b.iterations[col]), col
    assert np.array_equal(iterate(one), iterate(two))
    assert a.iterations["pipeline_time"][-1] > 0

    # payload across boundary 1 (rank 1 -> 2 forward, 2 -> 1 backward): items x d doubles
    # per call and direction. The one-node run moves nothing over the link.
    items = 3 if method == "pprs" else 1
    payload = ITERATIONS * items * DIM * 8
    sent, received = after[0] - middle[0], after[1] - middle[1]
    assert sent >= payload and received >= payload, (sent, received, payload)
    assert middle[0] - before[0] < payload // 2, "a one-node run sent its messages on the link"


# -- bench transport: the TCP path between nodes beside shared memory inside one -------------


def test_bench_transport_across_nodes_beside_shared_memory(cluster, tmp_path):
    """``hpcpipe bench transport`` with 2 ranks on each of 2 nodes measures the pair inside
    n1 (shared memory) and the pair across n1-n2 (TCP): every size has a sane row for each
    pair, named by its hosts, and the network pair's bytes went over the link (at least one
    bandwidth window of the largest size: 64 x 16 KiB). No speed is asserted."""
    before = link_bytes("n1")
    p = mpirun(
        "n1,n2",
        2,
        ["-m", "hpcpipe", "bench", "transport", "--max-bytes", "16384", "--iters", "20",
         "--repeats", "1"],
        tmp_path,
        HPCPIPE_INSIDE_MPI="1",  # under this mpiexec: measure, do not launch again
    )  # fmt: skip
    after = link_bytes("n1")
    print(p.stdout)
    assert "pairs: ranks 0-1 on n1-n1, ranks 0-2 on n1-n2" in p.stdout, p.stdout
    assert "sanity: ok" in p.stdout, p.stdout
    rows = [r for r in (line.split() for line in p.stdout.splitlines()) if r and r[0].isdigit()]
    sizes = [8 << k for k in range(12)]  # 8 B .. 16 KiB
    assert [(int(r[0]), r[1]) for r in rows] == [
        (s, pair) for pair in ("n1-n1", "n1-n2") for s in sizes
    ], p.stdout
    assert after[0] - before[0] >= 64 * 16384 and after[1] - before[1] > 0


# -- a bandwidth-limited link: measured wall-clock pipeline time against the prediction ------

RATE = "128kbit"  # bytes dominate: a 4 KiB message takes ~0.2 s, a layer's compute ~1 ms
WIDE = 512  # l1-chain dimension: 4 KiB activations and gradients


def test_bandwidth_limited_run_matches_placement_aware_prediction(cluster, tmp_path):
    """With the links limited by tc tbf, a 4-rank GD run with 2 ranks per node (one hop of
    three crosses nodes) takes the wall-clock pipeline time the model predicts, within
    ±15%: the link is calibrated first (one-way time at 8 bytes: α_inter; at the message
    size: β_inter), then the run's own prediction (figures.predicted_pipeline_time: the
    simulator with α_inter + n·β_inter on the crossing hop) is held against its measured
    time. Predictions blind to placement (every hop free, or every hop across the network)
    miss by far more than 15%: the check can fail."""
    nbytes = WIDE * 8
    rate = sh("rate", RATE)
    assert rate.returncode == 0, rate.stderr
    try:
        p = mpirun("n1,n2", 1, [str(PINGPONG), "8", str(nbytes)], tmp_path)
        t = {int(b): float(s) for b, s in (line.split() for line in p.stdout.splitlines())}
        alpha = t[8]
        beta = (t[nbytes] - alpha) / nbytes
        out = tmp_path / "limited.h5"
        hpcpipe_run(
            "n1,n2", 2, out,
            "--problem", "l1-chain", "--depth", "4", "--dim", str(WIDE), "--optimizer", "gd",
            "--iterations", "5", "--clock", "wall", "--wait", "sleep", "--layer-time", "0.001",
            "--eval-every", "0", "--alpha-inter", repr(alpha), "--beta-inter", repr(beta),
        )  # fmt: skip
    finally:
        off = sh("rate", "off")
        assert off.returncode == 0, off.stderr
    r = load(out)
    fig = json.loads(r.attrs["figures"])
    measured, predicted = fig["pipeline_time"], fig["predicted_pipeline_time"]

    # the same prediction, by hand, and two placement-blind ones
    hosts = json.loads(r.attrs["rank_hosts"])
    sch = build("gpipe", 4, 1)
    tf = tb = [0.001] * 4

    def predict(crossing: list[bool]) -> float:
        msg = hop_costs(LinkCosts(alpha_inter=alpha, beta_inter=beta), crossing, [WIDE] * 3, [1])
        return 5 * simulate(sch, tf, tb, msg).makespan

    assert crossings(hosts, 4) == [False, True, False]
    assert predict(crossings(hosts, 4)) == pytest.approx(predicted, rel=1e-12)
    blind_free, blind_net = predict([False] * 3), predict([True] * 3)
    print(
        f"link {RATE}: alpha_inter {alpha * 1e3:.2f} ms, beta_inter {beta * 1e6:.2f} us/B "
        f"({8 / beta / 1e3:.0f} kbit/s); pipeline time measured {measured:.3f} s, predicted "
        f"{predicted:.3f} s (ratio {measured / predicted:.3f}); placement-blind predictions "
        f"{blind_free:.3f} s (no hop crosses), {blind_net:.3f} s (every hop crosses)"
    )
    assert measured == pytest.approx(predicted, rel=0.15)
    assert measured != pytest.approx(blind_free, rel=0.15)
    assert measured != pytest.approx(blind_net, rel=0.15)


# -- Slurm across nodes: a generated --nodes=2 job -------------------------------------------

SWEEP = """
[sweep]
name = "two-nodes"
ranks = 4
[base]
problem = "l1-chain"
depth = 4
dim = 512
optimizer = "pprs"
gamma = 0.05
samples = 2
iterations = 5
progress = "off"
"""


def need_cluster_slurm() -> None:
    if (Path(os.environ.get("HPN_STATE", "/tmp/hpn-cluster")) / "slurm/slurm.conf").is_file():
        return
    why = "Slurm (slurmctld, slurmd, munge) is not installed: the cluster runs without it"
    if os.environ.get("HPCPIPE_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"HPCPIPE_REQUIRE_CLUSTER=1 but {why}")
    pytest.skip(f"{why}; apt-get install slurmctld slurmd slurm-client munge")


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_generated_two_node_job_runs_across_both_nodes(cluster, tmp_path, launcher):
    """`hpcpipe jobs generate --nodes 2 --ntasks-per-node 2`, submitted on the cluster's
    Slurm: the point's result lists ranks on n1 and n2, the job's 4 tasks (also under
    mpiexec, whose proxies see a step of 2), its messages crossed the link, and the
    dependent analysis ran and listed the point as complete."""
    need_cluster_slurm()
    sweep = tmp_path / "s.toml"
    sweep.write_text(SWEEP)
    folder = tmp_path / "jobs"
    opts = JobOptions(
        nodes=2, tasks_per_node=2, launcher=launcher, python=sys.executable, time="00:10:00"
    )
    generate(str(sweep), folder, opts)
    before = link_bytes("n1")
    p = sh("exec", "ctl", str(folder / "submit.sh"), cwd=folder)
    assert p.returncode == 0, p.stdout + p.stderr
    ids = (folder / "submitted.txt").read_text().split()
    for _ in range(600):
        q = sh("exec", "ctl", "squeue", "-h", "-j", ",".join(ids), "-o", "%i %T")
        if q.returncode == 0 and not q.stdout.strip():
            break
        time.sleep(0.5)
    else:
        sh("exec", "ctl", "scancel", *ids)
        raise AssertionError(f"jobs {ids} still queued after 300 s")
    after = link_bytes("n1")
    r = load(folder / "results" / "0000-point.h5")
    assert r.status == "complete"
    assert json.loads(r.attrs["rank_hosts"]) == ["n1", "n1", "n2", "n2"]
    slurm = json.loads(r.attrs["slurm"])
    assert slurm["SLURM_NTASKS"] == "4" and slurm["SLURM_JOB_NODELIST"] == "n[1-2]", slurm
    assert slurm["SLURM_TASKS_PER_NODE"] == "2(x2)", slurm
    payload = 5 * 2 * 512 * 8  # iterations x K items x d doubles, each direction
    assert after[0] - before[0] >= payload and after[1] - before[1] >= payload
    log = next((folder / "logs").glob("*analysis*.out")).read_text()
    assert "complete" in log and "0000-point.h5" in log and "wrote report" in log, log


# -- hpcpipe's own watchdog: a peer that stops answering is named, with its host -----------


def test_watchdog_names_the_silent_peer_and_its_host(cluster, tmp_path):
    """Rank 2 (on n2) stops answering at iteration 3; with --timeout 5 the others stop the
    run within seconds instead of waiting forever: rank 0 prints one line naming rank 2
    and its host (its census heard ranks 1 and 3); the file keeps its flushed iterations."""
    out = tmp_path / "silent.h5"
    p = sh(
        "mpiexec", "n1,n2", "2", sys.executable, "-m", "hpcpipe", "run", "--problem",
        "l1-chain", "--depth", "4", "--dim", "8", "--optimizer", "gd", "--iterations", "1000",
        "--flush-every", "1", "--inject-failure", "2:3:hang", "--timeout", "5",
        "--progress", "off", "--output", str(out),
        timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode != 0
    reports = [ln for ln in p.stderr.splitlines() if ln.startswith("hpcpipe:")]
    assert len(reports) == 1, p.stderr[-3000:]
    lost = "hpcpipe: rank 0 of 4 failed: watchdog: lost rank 2 on n2 (no progress for 5 s"
    assert reports[0].startswith(lost), reports[0]
    assert "Traceback" not in p.stderr
    assert len(load(out).iterations["iteration"]) >= 2


def revive(node: str) -> None:
    """Bring a lost node back: its link, and its slurmd when the cluster runs Slurm (until
    Slurm has it idle again, so that the next job can use it)."""
    assert sh("link-up", node).returncode == 0
    if not (Path(os.environ.get("HPN_STATE", "/tmp/hpn-cluster")) / "slurm/slurm.conf").is_file():
        return
    start = sh("start-node", node)
    assert start.returncode == 0, start.stderr
    for _ in range(120):
        state = sh("exec", "ctl", "sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()
        if state in ("idle", "mixed", "allocated"):
            return
        time.sleep(1)
    raise AssertionError(f"Slurm has {node} {state!r} 120 s after it came back")


def _ranks_left(node: str) -> list[str]:
    """The hpcpipe ranks still running on node."""
    p = sh("exec", node, "ps", "-eo", "args")
    return [ln for ln in p.stdout.splitlines() if "-m hpcpipe run" in ln]


def test_a_lost_node_is_named_by_the_watchdog_and_the_run_resumes(cluster, tmp_path):
    """n2 vanishes mid-run (link cut, every process killed: no goodbye reaches n1, as in a
    power loss; MPI and mpiexec keep waiting on it). With --timeout 5 the ranks on n1 end
    well within a minute, rank 0 printing one line naming the lost ranks on n2, with no
    traceback; the file reads as incomplete with its flushed rows; --resume on one node
    finishes it with a final iterate bitwise equal to an uninterrupted run's."""
    out = tmp_path / "lost.h5"
    base = ["--problem", "l1-chain", "--depth", "4", "--dim", "8", "--optimizer", "gd",
            "--lr", "0.01", "--iterations", "400", "--layer-time", "0.002", "--flush-every",
            "5", "--progress", "off"]  # fmt: skip
    args = ["-m", "hpcpipe", "run", *base, "--timeout", "5", "--output", str(out)]
    cmd = [str(CLUSTER), "mpiexec", "n1,n2", "2", sys.executable, *args]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, env=ENV, start_new_session=True)  # fmt: skip
    try:
        for _ in range(1200):
            if _flushed(out) >= 10 or job.poll() is not None:
                break
            time.sleep(0.2)
        flushed = _flushed(out)
        assert flushed >= 10 and job.poll() is None, "the run never flushed 10 iterations"
        lose = sh("lose-node", "n2")
        assert lose.returncode == 0, lose.stderr
        t0 = time.monotonic()
        while _ranks_left("n1") and time.monotonic() - t0 < 120:
            time.sleep(0.25)
        ended = time.monotonic() - t0
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.communicate()
        revive("n2")
    print(f"node n2 lost: the ranks on n1 ended {ended:.1f} s later")
    assert ended < 60, f"the ranks on n1 still ran {ended:.0f} s after n2 was lost"
    assert job.returncode != 0
    reports = [ln for ln in err.splitlines() if ln.startswith("hpcpipe:")]
    assert len(reports) == 1, err[-3000:]
    assert re.match(
        r"hpcpipe: rank 0 of 4 failed: watchdog: lost rank 2 on n2, rank 3 on n2 \(no "
        r"progress for 5 s",
        reports[0],
    ), reports[0]
    assert "Traceback" not in err
    cut = load(out)
    assert cut.status == "incomplete" and len(cut.iterations["iteration"]) >= flushed

    mpirun("n1", 4, ["-m", "hpcpipe", "run", "--resume", str(out), "--progress", "off"],
           tmp_path)  # fmt: skip
    whole = tmp_path / "whole.h5"
    hpcpipe_run("n1", 4, whole, *base[:-2])
    done = load(out)
    assert done.status == "complete" and int(done.attrs["resumed"]) >= 1
    assert len(done.iterations["iteration"]) == 400
    assert np.array_equal(iterate(out), iterate(whole))
    assert np.array_equal(done.iterations["loss"], load(whole).iterations["loss"])


# -- the loss of a node mid-run ----------------------------------------------------------------

LONG = """
[sweep]
name = "node-loss"
ranks = 4
[base]
problem = "l1-chain"
depth = 4
dim = 8
optimizer = "gd"
lr = 0.01
iterations = 400
layer_time = 0.002
flush_every = 5
progress = "off"
timeout = 5
"""


def _state(job: str) -> str:
    p = sh("exec", "ctl", "squeue", "-h", "-j", job, "-o", "%T")
    return p.stdout.strip() if p.returncode == 0 else "?"


def _flushed(path: Path) -> int:
    try:
        return len(load(path).iterations["iteration"])
    except Exception:  # not yet written, or between two flushes
        return 0


def test_node_loss_ends_the_job_and_a_resume_finishes_the_run(cluster, tmp_path):
    """n2 vanishes mid-job (link cut, then its slurmd and its ranks killed): hpcpipe's
    watchdog (timeout = 5) ends the job well within 60 s with one line naming the lost
    ranks on n2, before Slurm sees the node gone (its line precedes any node-failure
    line of the log, and comes before Slurm marks n2 down); the result file reads
    up to its last flush (incomplete); with n2 back, a resubmit (the job Slurm requeued
    cancelled first) resumes the point to the end, and its final iterate equals an
    uninterrupted run's."""
    need_cluster_slurm()
    sweep = tmp_path / "long.toml"
    sweep.write_text(LONG)
    folder = tmp_path / "jobs"
    opts = JobOptions(nodes=2, tasks_per_node=2, python=sys.executable, time="00:10:00")
    generate(str(sweep), folder, opts)
    p = sh("exec", "ctl", "sbatch", "--parsable", "array-4.sbatch", cwd=folder)
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    result = folder / "results" / "0000-point.h5"
    try:
        for _ in range(600):
            if _flushed(result) >= 20:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the job never flushed 20 iterations")
        lose = sh("lose-node", "n2")
        assert lose.returncode == 0, lose.stderr
        t0 = time.monotonic()
        logfile = folder / "logs" / f"hpcpipe-node-loss-r4-{job}_0.out"
        named = math.inf  # when hpcpipe's line is in the job's log
        while _state(job) == "RUNNING" and time.monotonic() - t0 < 90:
            if named == math.inf and "watchdog: lost" in logfile.read_text():
                named = time.monotonic() - t0
            time.sleep(0.25)
        ended = time.monotonic() - t0
        log = logfile.read_text()
        if "watchdog: lost" in log:
            named = min(named, ended)
        print(f"node n2 lost: hpcpipe named it after {named:.1f} s, the job stopped "
              f"running after {ended:.1f} s")  # fmt: skip
        assert ended < 60, f"the job still ran {ended:.0f} s after n2 was lost"
        reports = [ln for ln in log.splitlines() if "watchdog: lost" in ln]
        assert len(reports) == 1, log[-3000:]
        assert "lost rank 2 on n2, rank 3 on n2" in reports[0], reports[0]
        assert "Traceback" not in log
        # hpcpipe's line comes first; srun's teardown of the step then waits on n2, and
        # Slurm's node failure may still be written while it does
        fail = [i for i, ln in enumerate(log.splitlines()) if re.search("node failure", ln, re.I)]
        first = next(i for i, ln in enumerate(log.splitlines()) if "watchdog: lost" in ln)
        assert all(first < i for i in fail), log[-3000:]
        while time.monotonic() - t0 < 120:  # Slurm sees the node gone, later
            sinfo = sh("exec", "ctl", "sinfo", "-h", "-n", "n2", "-o", "%T")
            if sinfo.stdout.strip().startswith("down"):
                break
            time.sleep(1)
        down = time.monotonic() - t0
        print(f"node n2 lost: Slurm marked it {sinfo.stdout.strip()} after {down:.1f} s")
        assert sinfo.stdout.strip().startswith("down"), sinfo.stdout
        assert named < down, "Slurm saw the node gone before hpcpipe's watchdog did"
        cut = load(result)
        assert cut.status == "incomplete" and len(cut.iterations["iteration"]) >= 20

        # Slurm requeues the job on the node failure. Started again on the revived n2 (a new
        # slurmd that never saw the old step), its srun can wait for good on "Requested nodes
        # are busy". So the user's path is taken: cancel it, wait until the nodes are idle,
        # resubmit; the new job resumes the point.
        sh("exec", "ctl", "scancel", job)
        while _state(job) and time.monotonic() - t0 < 240:
            time.sleep(0.5)
        revive("n2")  # its link and slurmd, until Slurm has it idle again
        while time.monotonic() - t0 < 240:
            states = sh("exec", "ctl", "sinfo", "-h", "-N", "-o", "%T").stdout.split()
            if states and all(s == "idle" for s in states):
                break
            time.sleep(0.5)
        p = sh("exec", "ctl", "sbatch", "--parsable", "array-4.sbatch", cwd=folder)
        assert p.returncode == 0, p.stderr
        job = p.stdout.strip().split(";")[0]
        for _ in range(600):
            if not _state(job):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the resumed job {job} did not finish in 300 s")
    finally:
        sh("link-up", "n2")
        sh("exec", "ctl", "scancel", job)
    done = load(result)
    assert done.status == "complete" and int(done.attrs["resumed"]) >= 1
    assert len(done.iterations["iteration"]) == 400

    ref = tmp_path / "uninterrupted"
    mpirun("n1", 4, ["-m", "hpcpipe", "sweep", str(sweep), "--out", str(ref), "--point", "0",
                     "--inside"], tmp_path)  # fmt: skip
    whole = ref / "0000-point.h5"
    assert np.array_equal(iterate(result), iterate(whole))
    assert np.array_equal(done.iterations["loss"], load(whole).iterations["loss"])
