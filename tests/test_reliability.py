"""Bad input, failing ranks, interrupted and resumed jobs, bad files."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcpipe.run.config import FIELDS, ConfigError, make_config, validate
from hpcpipe.run.config import load as load_config
from hpcpipe.run.results import load
from hpcpipe.studies.sweep import load_sweep

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

# (settings, ranks, expected message fragment)
BAD = [
    ({"optimizr": "gd"}, None, "unknown key 'optimizr' (did you mean 'optimizer'?)"),
    ({"sampels": 3}, None, "did you mean 'samples'"),
    ({"zzz": 1}, None, "unknown key 'zzz'"),
    ({"depth": "four"}, None, "depth: expected an integer, got 'four'"),
    ({"depth": True}, None, "depth: expected an integer"),
    ({"lr": "fast"}, None, "lr: expected a number, got 'fast'"),
    ({"problem": "mnist"}, None, "problem = 'mnist' is not allowed: choose one of"),
    ({"schedule": "zigzag"}, None, "schedule = 'zigzag' is not allowed"),
    ({"optimizer": "adam"}, None, "optimizer = 'adam' is not allowed"),
    ({"clock": "sundial"}, None, "clock = 'sundial'"),
    ({"wait": "nap"}, None, "wait = 'nap'"),
    ({"samples": 0, "optimizer": "pprs"}, None, "samples = 0 is not allowed: must be >= 1"),
    ({"lr": 0}, None, "lr = 0.0 is not allowed: must be a finite number > 0"),
    ({"lr": -1e-3}, None, "lr = -0.001 is not allowed"),
    ({"lr": "nan"}, None, "lr = nan is not allowed"),
    ({"gamma": -0.1, "optimizer": "pprs"}, None, "gamma = -0.1 is not allowed: must be a finite"),
    ({"depth": 0}, None, "depth = 0 is not allowed: must be >= 1"),
    ({"depth": 2}, 4, "depth = 2 is not allowed: depth must be >= the number of ranks (4)"),
    ({"width": 0}, None, "width = 0 is not allowed"),
    ({"dim": 0}, None, "dim = 0 is not allowed"),
    ({"m": 0}, None, "m = 0 is not allowed"),
    ({"iterations": 0}, None, "iterations = 0 is not allowed"),
    ({"optimizer": "gd", "samples": 4}, None, "gd uses one sample"),
    ({"optimizer": "agd", "gamma": 0.1}, None, "agd does no smoothing"),
    ({"problem": "l1-chain", "m": 3}, None, "l1-chain has one example (m = 1)"),
    ({"problem": "attack", "m": 11}, None, "the attack uses between 1 and 10 images"),
    ({"problem": "attack", "radius": 0}, None, "the attack needs a radius > 0"),
    ({"problem": "fewshot", "m": 30}, None, "fewshot trains on at most 20 examples"),
    ({"mode": "theory"}, None, "theory mode needs a target epsilon > 0"),
    (
        {"mode": "theory", "epsilon": 0.1, "problem": "fewshot", "m": 5},
        None,
        "theory mode needs a problem with known L",
    ),
    ({"momentum": "lots"}, None, "momentum = 'lots' is not allowed"),
    ({"momentum": "1.5"}, None, "momentum = '1.5' is not allowed"),
    ({"microbatches": 5, "m": 2, "problem": "fewshot"}, None, "microbatches = 5 is not allowed"),
    ({"eval_every": -1}, None, "eval_every = -1 is not allowed"),
    ({"flush_every": 0}, None, "flush_every = 0 is not allowed"),
    ({"timeout": -5}, None, "timeout = -5.0 is not allowed"),
    ({"inject_failure": "soon"}, None, "inject_failure = 'soon' is not allowed"),
    ({"progress": "loud"}, None, "progress = 'loud' is not allowed"),
]


@pytest.mark.parametrize(("values", "ranks", "message"), BAD, ids=[str(b[0]) for b in BAD])
def test_bad_configs_are_rejected_with_a_clear_message(values, ranks, message):
    with pytest.raises(ConfigError) as e:
        cfg = make_config(values)
        validate(cfg, ranks)
    assert message in str(e.value)


def test_output_that_exists_or_is_unwritable(tmp_path):
    f = tmp_path / "r.h5"
    f.write_bytes(b"")
    with pytest.raises(ConfigError, match="exists already"):
        make_config({"output": str(f)})
    if os.geteuid() != 0:  # root can write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="is not writable"):
            make_config({"output": str(ro / "x.h5")})


VALUES = st.one_of(
    st.integers(-5, 50),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.booleans(),
    st.sampled_from(
        [
            "gd",
            "agd",
            "pprs",
            "gpipe",
            "1f1b",
            "attack",
            "l1-chain",
            "theory",
            "nesterov",
            "model",
            "0.5",
            "3",
        ]
    ),
)
KEYS = st.sampled_from(sorted(FIELDS) + ["bogus", "sampels"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, VALUES, max_size=6), st.integers(1, 8))
def test_random_configs_validate_or_raise_config_error(values, ranks):
    values.pop("output", None)  # no files from a property test
    try:
        cfg = make_config(values)
        validate(cfg, ranks)
    except ConfigError as e:
        assert str(e)  # a message, not a traceback
        return
    assert cfg.depth >= ranks


def hpcpipe(*args, timeout=120, env=None):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
    )


def test_validate_command(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('problem = "l1-chain"\ndepth = 4\n')
    p = hpcpipe("validate", str(good), "--np", "4")
    assert p.returncode == 0 and p.stdout.startswith("ok:")
    p = hpcpipe("validate", str(good), "--np", "8")
    assert p.returncode == 2 and "depth = 4 is not allowed" in p.stderr
    p = hpcpipe("validate", str(tmp_path / "nope.toml"))
    assert p.returncode == 2 and "nope.toml" in p.stderr and "does not exist" in p.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("depth = = 3")
    p = hpcpipe("validate", str(bad))
    assert p.returncode == 2 and "not valid TOML" in p.stderr


RUN = [
    "run",
    "--problem",
    "l1-chain",
    "--depth",
    "4",
    "--dim",
    "8",
    "--optimizer",
    "pprs",
    "--samples",
    "2",
    "--gamma",
    "0.05",
    "--lr",
    "0.05",
    "--progress",
    "off",
]


def test_a_failing_rank_brings_the_job_down():
    t0 = time.time()
    p = hpcpipe(
        *RUN,
        "--np",
        "4",
        "--iterations",
        "1000",
        "--inject_failure",
        "2:5",
        "--no-output",
        timeout=60,
    )
    assert time.time() - t0 < 30
    assert p.returncode != 0
    assert "rank 2 of 4 failed" in p.stderr and "injected failure on rank 2" in p.stderr
    # one line by the failing rank, no traceback (HPCPIPE_DEBUG=1 shows it: test_one_line_errors)
    lines = [line for line in p.stderr.splitlines() if line.startswith("hpcpipe")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr


def test_watchdog_reports_who_waits_for_what():
    """The middle rank of three hangs; the others' watchdogs fire and their census hears
    each other but not rank 1: rank 0 alone reports, naming rank 1 and its host, and the
    wait it was in (a gradient from rank 1 or, if rank 0 had gone on, a collective). The
    subprocess timeout is only a guard against a hang."""
    p = hpcpipe(
        *RUN,
        "--np",
        "3",
        "--iterations",
        "1000",
        "--inject_failure",
        "1:3:hang",
        "--timeout",
        "2",
        "--no-output",
        timeout=300,
    )
    assert p.returncode != 0
    host = re.escape(socket.gethostname())
    reports = [ln for ln in p.stderr.splitlines() if ln.startswith("hpcpipe:")]
    assert len(reports) == 1, p.stderr[-3000:]
    assert re.match(
        rf"hpcpipe: rank 0 of 3 failed: watchdog: lost rank 1 on {host} \(no progress for "
        rf"2 s, no answer within 2 s\): rank 0 waits (for the gradient of item \d+ from rank "
        rf"1 on {host} |in )",
        reports[0],
    ), reports[0]


def assert_sigterm_then_resume_bitwise(
    tmp_path, run_args: list, env=None, resume_args: tuple = ()
) -> None:
    """A run stopped by SIGTERM and resumed ends bitwise where an uninterrupted one does:
    every array and scalar of the optimizer's saved state, and every loss (2 ranks,
    300 iterations slowed by emulated layers, a flush every 7). ``resume_args`` are given
    again on resume (a user's own package.module:attribute parts)."""
    env = env or ENV
    n = 300
    common = [*run_args, "--np", "2", "--iterations", str(n), "--layer_time", "0.002"]
    common += ["--flush_every", "7"]
    full = str(tmp_path / "full.h5")
    p = hpcpipe(*common, "--output", full, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    part = str(tmp_path / "part.h5")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcpipe", *common, "--output", part],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    t0 = time.time()
    while time.time() - t0 < 120:
        if os.path.exists(part):
            try:
                if len(load(part).iterations["iteration"]) >= 20:
                    break
            except Exception:
                pass
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    r = load(part)
    assert r.status == "incomplete" and 20 <= len(r.iterations["iteration"]) < n
    resume = ["run", "--np", "2", "--resume", part, "--progress", "off", *resume_args]
    p = hpcpipe(*resume, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    a, b = load(full), load(part)
    assert b.status == "complete" and int(b.attrs["resumed"]) == 1
    assert b.iterations["iteration"].tolist() == list(range(1, n + 1))
    with h5py.File(full) as fa, h5py.File(part) as fb:
        names = sorted(fa["state/optimizer"])
        assert "theta" in names and names == sorted(fb["state/optimizer"])
        for k in names:  # bitwise
            np.testing.assert_array_equal(
                fa[f"state/optimizer/{k}"][()], fb[f"state/optimizer/{k}"][()]
            )
        for k in ("optimizer_scalars", "scalars"):
            np.testing.assert_array_equal(fa[f"state/{k}"][()], fb[f"state/{k}"][()])
    np.testing.assert_array_equal(a.iterations["loss"], b.iterations["loss"])


def test_sigterm_then_resume_equals_uninterrupted(tmp_path):
    assert_sigterm_then_resume_bitwise(tmp_path, RUN)


def test_resume_rejects_truncated_foreign_and_complete_files(tmp_path):
    out = str(tmp_path / "done.h5")
    p = hpcpipe(*RUN, "--np", "1", "--depth", "2", "--iterations", "3", "--output", out)
    assert p.returncode == 0, p.stderr
    p = hpcpipe("run", "--resume", out)
    assert p.returncode == 2 and "status is 'complete'" in p.stderr
    trunc = tmp_path / "trunc.h5"
    trunc.write_bytes(open(out, "rb").read()[:1000])
    p = hpcpipe("run", "--resume", str(trunc))
    assert p.returncode == 2 and "trunc.h5" in p.stderr
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = 1
    p = hpcpipe("run", "--resume", str(foreign))
    assert p.returncode == 2 and "foreign.h5" in p.stderr and "not an hpcpipe result" in p.stderr


def test_shipped_configs_and_sweeps_validate(tmp_path):
    """Every config and sweep file the README points at validates before any launch."""
    root = Path(__file__).parent.parent
    cfg = load_config(str(root / "jobs" / "run-example.toml"))
    validate(cfg, 4)
    assert cfg.problem == "attack" and cfg.optimizer == "pprs"
    sweeps = sorted((root / "jobs" / "sweeps").glob("*.toml"))
    assert {s.stem for s in sweeps} == {
        "pipeline-time",
        "depth-wall",
        "depth-wall-cluster",
        "depth-mpi",
        "dimension",
        "smooth",
        "smooth-worstcase",
        "lower",
        "lower-mpi",
        "nonconvex",
        "nonconvex-mpi",
        "paper",
        "paper-fgsm",
        "paper-fewshot",
        "paper-gamma",
        "paper-mpi",
    }
    for s in sweeps:
        if s.stem in ("depth-wall", "depth-wall-cluster", "pipeline-time"):
            # their machine profiles are made by `hpcpipe calibrate --sweep` (or the Slurm
            # folder's calibration jobs) before the sweep (tests/test_depth_wall.py runs
            # both); without them the sweep says so, in one line, and all else validates
            with pytest.raises(ConfigError, match="hpcpipe calibrate"):
                load_sweep(s, out=str(tmp_path / s.stem))
            assert len(load_sweep(s, out=str(tmp_path / s.stem), profiles=False).points) >= 6
            continue
        sw = load_sweep(s, out=str(tmp_path / s.stem))
        assert len(sw.points) >= 9, s
        for p in sw.points:
            validate(make_config(p.values), p.ranks)
