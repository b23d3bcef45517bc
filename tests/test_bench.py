"""Benchmark commands run on tiny sizes and print their header (no timing is asserted)."""

import os
import subprocess
import sys

import pytest

from hpcpipe.bench.common import paired, ratios
from hpcpipe.bench.simulate import bench_simulate

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def bench(*args):
    p = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("command: hpcpipe bench " + args[0]), p.stdout
    assert "MPICH" in p.stdout or "Open MPI" in p.stdout, p.stdout
    return p.stdout


def test_transport_reports_every_raw_path_and_both_ratios():
    out = bench("transport", "--max-bytes", "64", "--iters", "5", "--repeats", "1")
    assert "lat ratio" in out and "bw ratio" in out and "sanity: ok" in out
    assert len([line for line in out.splitlines() if line.strip().startswith(("8 ", "64 "))]) == 2


def test_dense_checks_the_bare_loop_gradient():
    out = bench("dense", "--width", "8", "--mb", "1,2", "--micro", "2", "--repeats", "1")
    assert "step/bare" in out and "gradients equal" in out


def test_pipeline_at_more_ranks_than_cores():
    out = bench(
        "pipeline", "--np", "3", "--layer-time", "0.0002", "--samples", "2", "--repeats", "1"
    )
    assert "efficiency" in out and "sanity: ok" in out


def test_pipeline_refuses_fewer_layers_than_ranks():
    p = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "bench", "pipeline", "--np", "2", "--depth", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert p.returncode == 2 and "--depth must be >=" in p.stdout + p.stderr


def test_simulate_case_in_process(capsys):
    assert bench_simulate(1, stages=4, items=4, big=8, big_repeats=1, query=(4, 10)) == 0
    out = capsys.readouterr().out
    assert "M actions/s" in out and "gpipe" in out and "fill-drain" in out


def test_paired_alternates_the_order():
    seen = []
    times = paired({"a": lambda: seen.append("a"), "b": lambda: seen.append("b")}, 3, warmup=1)
    assert seen == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(times["a"]) == len(times["b"]) == 3
    assert ratios([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == pytest.approx(3.0)


def test_study_case_times_numerics_and_timing_of_the_simulated_executor(capsys):
    from hpcpipe.bench.study import bench_study

    assert bench_study([4, 8], 4, 2, 1) == 0
    out = capsys.readouterr().out
    assert "timing (ms)" in out and "numerics fused (ms)" in out and "sanity: ok" in out
