"""The command line: demo, run (self-launching), config errors."""

import json
import os
import re
import subprocess
import sys

import pytest

from hpcpipe.cli.settings import overrides as _overrides
from hpcpipe.run.config import ConfigError, load
from hpcpipe.run.results import load as load_result

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def hpcpipe(*args, timeout=300, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
    )


def test_demo_shows_the_crossover_measured_and_predicted(tmp_path):
    """`hpcpipe demo`: time to eps per method and depth, PPRS faster than GD at the deep end,
    the measured crossover within a factor 2 of the one the iteration counts predict, the
    MPI cell equal to its simulated twin, and a picture."""
    p = hpcpipe("demo", "--figure", str(tmp_path / "d.png"))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["method"])
    depths = [int(w.rstrip("*")) for w in lines[head].split()[1:]]
    assert depths == sorted(depths) and depths[0] <= 4 and depths[-1] >= 1024
    rows = {r.split()[0]: r.split()[1:] for r in lines[head + 2 : head + 6]}
    assert list(rows) == ["GD", "AGD", "PPRS", "GD/PPRS"]
    gd, pprs = (list(map(float, rows[k])) for k in ("GD", "PPRS"))
    assert pprs[-1] < gd[-1] / 1.5 and pprs[0] > gd[0]  # slower when shallow, faster deep
    assert "(MPI = simulated at depth 4: yes)" in p.stdout
    m = re.search(r"measured ([0-9.]+); predicted ([0-9.]+) from the iteration counts", p.stdout)
    measured, predicted = float(m.group(1)), float(m.group(2))
    assert predicted / 2 <= measured <= 2 * predicted
    assert "PPRS reaches eps first" in p.stdout
    assert (tmp_path / "d.png").stat().st_size > 10_000


def test_demo_attack_prints_its_table():
    p = hpcpipe("demo", "attack")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("method"))
    rows = [line.split() for line in lines[head + 2 : head + 5]]
    assert [r[0] for r in rows] == ["GD", "AGD", "PPRS"]
    for r in rows:
        assert r[-1] == "complete"
        assert 0.0 <= float(r[-5]) <= 1.0  # attack success rate
    budgets = {float(r[-3]) for r in rows}
    assert len(budgets) == 1  # the same pipeline time for every method


def test_run_self_launches_on_two_ranks_and_writes_a_result_by_default(tmp_path):
    p = hpcpipe(
        "run",
        "--np",
        "2",
        "--problem",
        "l1-chain",
        "--depth",
        "2",
        "--optimizer",
        "gd",
        "--lr",
        "0.05",
        "--iterations",
        "5",
        "--progress",
        "off",
        "--layer_time",
        "0.001",
        "--clock",
        "wall",
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "status complete" in p.stdout
    assert p.stdout.count("\n") >= 8
    files = list((tmp_path / "runs").glob("l1-chain-gd-*.h5"))
    assert len(files) == 1 and f"wrote runs/{files[0].name}" in p.stdout
    r = load_result(files[0])
    figs = json.loads(r.attrs["figures"])
    assert r.status == "complete" and r.attrs["n_ranks"] == 2
    assert r.attrs["command"].startswith("python -m hpcpipe run --np 2 --problem l1-chain")
    assert 0 < figs["bubble_fraction"] < 1 and 0 < figs["efficiency"] <= 1.05
    assert figs["predicted_pipeline_time"] == pytest.approx(5 * 2 * 2 * 0.001)


def test_config_error_exits_2_before_launch():
    p = hpcpipe("run", "--np", "4", "--depth", "2")
    assert p.returncode == 2
    assert "depth = 2 is not allowed" in p.stderr and "number of ranks (4)" in p.stderr


def test_overrides_and_did_you_mean(tmp_path):
    assert _overrides(["--lr", "0.1", "--depth=3", "seed=4"]) == ["lr=0.1", "depth=3", "seed=4"]
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text('[run]\nproblem = "max-chain"\ndepth = 3\n')
    cfg = load(str(cfg_file), ["lr=0.5"])
    assert cfg.problem == "max-chain" and cfg.depth == 3 and cfg.lr == 0.5
    with pytest.raises(ConfigError, match="did you mean 'samples'"):
        load(None, ["sampels=3"])
    with pytest.raises(ConfigError, match="does not exist"):
        load(str(tmp_path / "missing.toml"))
