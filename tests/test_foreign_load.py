"""The other processes' CPU during a measurement (hpcpipe.machine.foreign) decides whether a
wall-clock row is judged: the job's own ranks, which the load average counts, do not make
the machine busy; another process that takes a core does."""

import math
import subprocess
import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.machine import foreign
from hpcpipe.machine.calibrate import busy_note
from hpcpipe.run.config import make_config
from hpcpipe.run.results import load
from hpcpipe.run.runner import run
from hpcpipe.studies.common import Record, foreign_load, load_check

STAT = "cpu  {u} {n} {s} {i} {w} {q} {sq} {st} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def test_proc_stat_busy_seconds_count_all_but_idle_and_iowait(tmp_path):
    p = tmp_path / "stat"
    p.write_text(STAT.format(u=100, n=20, s=30, i=5000, w=700, q=1, sq=2, st=47))
    hz = foreign.os.sysconf("SC_CLK_TCK")
    assert foreign.host_busy_seconds(str(p)) == pytest.approx((100 + 20 + 30 + 1 + 2 + 47) / hz)
    assert math.isnan(foreign.host_busy_seconds(str(tmp_path / "missing")))
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert math.isnan(foreign.host_busy_seconds(str(tmp_path / "odd")))


def test_foreign_cores_is_host_busy_less_own_cpu_over_wall():
    assert foreign.foreign_cores(3.0, 1.0, 2.0) == 1.0
    assert foreign.foreign_cores(1.0, 1.02, 2.0) == pytest.approx(-0.01)  # kept as measured
    assert math.isnan(foreign.foreign_cores(math.nan, 1.0, 2.0))
    assert foreign.busy(0.51, 2) and not foreign.busy(0.5, 2) and not foreign.busy(math.nan, 2)


def test_span_subtracts_the_jobs_own_cpu():
    """A fake host counter that advances by this process's CPU plus 0.8 s of another
    process: the span reports that other process's share, not this one's."""
    ticks = {"other": 0.0}

    def reader() -> float:
        return foreign.own_cpu_seconds() + ticks["other"]

    span = foreign.ForeignLoad(None, reader=reader)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2:  # this process's own work: not foreign
        pass
    ticks["other"] = 0.8
    wall = time.perf_counter() - span.t0
    got = span.stop()
    assert got == pytest.approx(0.8 / wall, rel=0.05)


def test_a_process_spinning_beside_the_span_is_measured():
    """A real spinner beside a sleeping span: its CPU shows as foreign (on an idle machine
    about one core; any load from elsewhere only adds to it)."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the spinner is running
        span = foreign.ForeignLoad(MPI.COMM_SELF)
        time.sleep(1.0)
        got = span.stop()
    finally:
        spin.kill()
        spin.wait()
    assert got > 0.3


def test_a_run_records_the_foreign_cpu(tmp_path):
    out = tmp_path / "r.h5"
    values = {"problem": "l1-chain", "depth": 2, "dim": 8, "iterations": 3}
    res = run(make_config({**values, "executor": "simulated", "output": str(out)}), MPI.COMM_SELF)
    assert res.status == "complete"
    assert math.isfinite(load(out).info["foreign_cpu"])


def _rec(load: float, fcpu: float | None, cores: int = 2) -> Record:
    info = {"load_start": load, "load_end": load, "cores": cores}
    if fcpu is not None:
        info["foreign_cpu"] = fcpu
    return Record("r.h5", {}, {}, {}, "complete", {"iteration": np.arange(1.0, 3.0)}, 32, info)


def test_own_ranks_do_not_make_the_machine_busy_others_do():
    # 32 polling ranks on 2 cores: load average 30, other processes 0.05 core: judged
    text, why = load_check([_rec(30.0, 0.05)], "RERUN")
    assert why == "" and "other processes 0.05 of 2 cores" in text and "30.00" in text
    # another process took a core: not enforced, with the figure and how to rerun
    text, why = load_check([_rec(1.2, 1.1), _rec(0.5, 0.02)], "RERUN")
    assert "1.10 of 2 cores" in why and "busy machine" in why and why.endswith("RERUN")
    # files without the figure: the load-average rule
    assert load_check([_rec(3.0, None)], "R")[1].startswith("load 3.00 on 2 cores: busy")
    assert load_check([_rec(1.0, None)], "R")[1] == ""
    assert foreign_load([_rec(1.0, 0.2), _rec(1.0, None)]) is None


def test_a_profile_is_busy_by_the_other_processes_not_by_its_ranks():
    assert busy_note([32.0], [31.0], 2, foreign=0.03) == ""
    assert "0.90 of 2 cores" in busy_note([0.1], [0.1], 2, foreign=0.9)
    assert busy_note([3.0], [3.0], 2).startswith("calibrated under load 3.00")  # fallback
