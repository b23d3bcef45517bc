"""Machine profiles: the α + β·bytes fit, the TOML schema and its errors, the costs a
profile gives a run (in seconds), and the command line's refusals (exit 2, one line)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.errors import ConfigError
from hpcpipe.machine.calibrate import fit, spread
from hpcpipe.machine.profile import dumps, parse, read
from hpcpipe.model.stages import ModelSpec
from hpcpipe.mpi_library import clean_library_name, library_name
from hpcpipe.pipeline.simulator import closed_form
from hpcpipe.run.config import make_config, validate
from hpcpipe.run.results import load as load_result
from hpcpipe.run.runner import run

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
LIBRARY = library_name()
ALPHA, BETA, WAKE = 40e-6, 2e-9, 15e-6
T_F, T_B, SLEEP = 30e-6, 45e-6, 2.1e-3
NOISE = 12e-6


def profile_data(ranks=4, library=LIBRARY, alpha=ALPHA, emulated=True, noise=True) -> dict:
    """A profile as plain data, as ``calibrate`` returns it, with known costs."""
    sizes = [8, 2048, 16384]
    msg = {
        "alpha": alpha,
        "beta": BETA,
        "residual": 0.0,
        "sizes": sizes,
        "hop_seconds": [alpha + BETA * b for b in sizes],
        "wakeup": WAKE,
    }
    layer = {"rows": 1, "forward": T_F, "backward": T_B, "spread": 0.1}
    if noise:
        layer["noise"] = NOISE
    return {
        "machine": {"host": "h", "cores": 2, "mpi_library": library, "date": "d", "load_start": []},
        "placement": {"ranks": ranks, "hosts": ["h"], "ranks_per_host": ranks},
        "message": {p: dict(msg) for p in ("busy", "yield", "sleep")},
        "layers": [{"kind": k, "width": 16, **layer} for k in ("orthogonal", "dense", "mlp")],
        "emulated": {"layer_time": 0.002, "sleep": SLEEP, "spread": 0.0} if emulated else {},
    }


def write(tmp_path, data, name="machine.toml") -> str:
    p = tmp_path / name
    p.write_text(dumps(data))
    return str(p)


# ---------------------------------------------------------------- the fit
def test_fit_recovers_alpha_and_beta_of_exact_timings():
    sizes = [8, 1024, 8192, 65536, 131072]
    f = fit(sizes, [20e-6 + 3e-10 * b for b in sizes])
    assert f.alpha == pytest.approx(20e-6, rel=1e-9)
    assert f.beta == pytest.approx(3e-10, rel=1e-9)
    assert f.residual < 1e-9


def test_fit_of_noisy_timings_reports_its_residual():
    sizes = np.array([8, 1024, 8192, 65536, 131072])
    noise = np.array([1.1, 0.9, 1.05, 0.95, 1.0])
    f = fit(sizes, (20e-6 + 3e-10 * sizes) * noise)
    assert 0.01 < f.residual < 0.2
    assert f.alpha == pytest.approx(20e-6, rel=0.3)


def test_fit_never_returns_negative_costs():
    flat = fit([8, 1024, 8192], [3e-4, 2e-4, 1e-4])  # slope < 0: noise on a flat curve
    assert flat.beta == 0.0 and flat.alpha == pytest.approx(2e-4)
    origin = fit([1000, 2000, 3000], [1e-6, 3e-6, 5e-6])  # intercept < 0
    assert origin.alpha == 0.0 and origin.beta > 0


def test_a_tenfold_alpha_is_seen_by_the_fit():
    sizes = [8, 2048, 16384]
    good = fit(sizes, [ALPHA + BETA * b for b in sizes])
    bad = fit(sizes, [10 * ALPHA + BETA * b for b in sizes])
    assert bad.alpha / good.alpha == pytest.approx(10, rel=1e-6)


def test_spread_is_the_relative_interquartile_range():
    assert spread([1.0, 1.0, 1.0]) == 0.0
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4 - 2) / 3)


# ---------------------------------------------------------------- the schema
def test_profile_round_trips_through_toml(tmp_path):
    prof = read(write(tmp_path, profile_data()))
    assert prof.ranks == 4 and prof.mpi_library == LIBRARY
    assert prof.message("sleep").alpha == ALPHA and prof.message("busy").beta == BETA
    assert prof.layer("mlp", 16).backward == T_B
    assert prof.emulated.sleep == SLEEP
    assert "[message.yield]" in prof.text


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda t: t.replace("schema = 1", "schema = 7"), "schema"),
        (lambda t: t.replace("[placement]", "[placement"), "not valid TOML"),
        (lambda t: t.replace(f"alpha = {ALPHA!r}", "alpha = -1.0", 1), "message.busy.alpha"),
        (lambda t: t.replace(f"alpha = {ALPHA!r}", 'alpha = "fast"', 1), "message.busy.alpha"),
        (lambda t: t.replace(f"beta = {BETA!r}", "", 1), "message.busy.beta: missing"),
        (lambda t: t.replace("ranks = 4", "ranks = 0", 1), "placement.ranks"),
        (lambda t: t.replace("[message.sleep]", "[message.nap]"), "message.nap"),
        (lambda t: t.replace('kind = "dense"', 'kind = "conv"'), "layers[1].kind"),
        (lambda t: t.replace("sizes = [8, 2048, 16384]", "sizes = [8]", 1), "hop_seconds"),
        (lambda t: t.replace(f"sleep = {SLEEP!r}", "sleep = nan"), "emulated.sleep"),
        (lambda t: t.replace(f"noise = {NOISE!r}", "noise = -1.0", 1), "layers[0].noise"),
        (lambda t: t.replace("mpi_library", "mpi_lib"), "machine.mpi_library"),
    ],
)
def test_a_malformed_profile_names_its_field(edit, field):
    text = edit(dumps(profile_data()))
    with pytest.raises(ConfigError) as e:
        parse(text, "m.toml")
    msg = str(e.value)
    assert field in msg and "m.toml" in msg and "\n" not in msg


def test_a_profile_refuses_another_run(tmp_path):
    prof = read(write(tmp_path, profile_data()))
    prof.check_run(4, "yield", 0.002, LIBRARY)  # fits
    cases = [
        ((8, "yield", 0.0, LIBRARY), "placement.ranks"),
        ((4, "yield", 0.0, "Open MPI v5"), "machine.mpi_library"),
        ((4, "yield", 0.001, LIBRARY), "emulated.layer_time"),
    ]
    for args, field in cases:
        with pytest.raises(ConfigError, match=field):
            prof.check_run(*args)
    only_sleep = profile_data()
    del only_sleep["message"]["busy"]
    with pytest.raises(ConfigError, match="message.busy"):
        read(write(tmp_path, only_sleep, "s.toml")).check_run(4, "busy", 0.0, LIBRARY)
    with pytest.raises(ConfigError, match="emulated"):
        read(write(tmp_path, profile_data(emulated=False), "e.toml")).check_run(
            4, "busy", 0.002, LIBRARY
        )


# ---------------------------------------------------------------- costs in seconds
def test_cost_model_charges_the_profiles_seconds(tmp_path):
    prof = read(write(tmp_path, profile_data()))
    spec = ModelSpec("orthogonal", depth=3, d_in=16, d_out=16)
    c = prof.cost_model(spec, rows=1, policy="sleep")
    assert c.t_forward == (T_F,) * 3 and c.t_backward == (T_B,) * 3
    assert (c.alpha, c.beta) == (ALPHA, BETA)
    emu = prof.cost_model(spec, rows=1, policy="sleep", layer_time=0.002)
    assert emu.t_forward == (T_F + SLEEP,) * 3
    # an MLP 8 -> 16 -> 16 -> 4: blocks charged by rows * n_in * n_out against 16 x 16
    mlp = ModelSpec("mlp", depth=3, d_in=8, d_out=4, width=16)
    c = prof.cost_model(mlp, rows=2, policy="busy")
    assert c.t_forward == pytest.approx((T_F * 2 * 8 / 16, T_F * 2, T_F * 2 * 4 / 16), rel=1e-15)
    with pytest.raises(ConfigError, match="width 32"):
        prof.cost_model(ModelSpec("dense", depth=2, d_in=32, d_out=32), 1, "busy")


def test_cost_model_charges_the_input_noise_on_the_first_forward(tmp_path):
    """A call that smooths its input draws Z_k (rows × d_in) on the first block's
    forward: the profile's ``noise``, scaled by rows·d_in/(rows_cal·w); nothing else."""
    prof = read(write(tmp_path, profile_data()))
    spec = ModelSpec("orthogonal", depth=3, d_in=16, d_out=16)
    plain = prof.cost_model(spec, rows=1, policy="sleep")
    c = prof.cost_model(spec, rows=1, policy="sleep", input_noise=True)
    assert c.t_forward == (T_F + NOISE, T_F, T_F) and c.t_backward == plain.t_backward
    two = prof.cost_model(spec, rows=2, policy="sleep", input_noise=True)
    assert two.t_forward[0] == pytest.approx(2 * T_F + 2 * NOISE, rel=1e-15)
    # an MLP 8 -> 16 -> 4: the noise has d_in = 8 values per row
    mlp = ModelSpec("mlp", depth=2, d_in=8, d_out=4, width=16)
    m = prof.cost_model(mlp, rows=1, policy="sleep", input_noise=True)
    assert m.t_forward[0] - prof.cost_model(mlp, 1, "sleep").t_forward[0] == pytest.approx(
        NOISE * 8 / 16, rel=1e-12
    )


def test_a_profile_without_noise_loads_and_charges_none(tmp_path):
    """Profiles written before the ``noise`` field load; their draw is 0 (documented)."""
    text = dumps(profile_data(noise=False))
    assert "noise" not in text
    prof = parse(text)
    assert all(c.noise == 0.0 for c in prof.layers)
    spec = ModelSpec("orthogonal", depth=2, d_in=16, d_out=16)
    assert prof.cost_model(spec, 1, "busy", input_noise=True) == prof.cost_model(spec, 1, "busy")
    assert parse(dumps(profile_data())).layers[0].noise == NOISE


def test_the_recorded_run_says_whether_it_draws_input_noise():
    from types import SimpleNamespace

    from hpcpipe.studies.calibrated import input_noise

    def rec(gamma, problem):
        return SimpleNamespace(method={"gamma": gamma}, problem=problem, config={})

    assert input_noise(rec(1e-3, {"name": "mlp-attack", "variable": "input"}))
    assert not input_noise(rec(0.0, {"name": "nesterov-chain", "variable": "input"}))
    assert not input_noise(rec(1e-3, {"name": "digits", "variable": "weights"}))
    # results before the recorded variable: the chains smooth their input, others unknown
    assert input_noise(rec(1e-3, {"name": "nesterov-chain"}))
    assert not input_noise(rec(1e-3, {"name": "digits"}))


def test_calibrate_times_the_noise_draw():
    from hpcpipe.machine.calibrate import layer_times

    got = layer_times("orthogonal", 16, 1, 0.002, 3)
    assert got["noise"] > 0 and np.isfinite(got["noise"])


@pytest.mark.parametrize("schedule", ["gpipe", "sequential"])
def test_simulated_run_with_a_profile_times_iterations_in_seconds(tmp_path, schedule):
    """The run loop's pipeline time is the closed form under the profile's costs:
    GD on a chain of S = 4 one-block stages, one item; messages of d·8 bytes."""
    path = write(tmp_path, profile_data())
    cfg = make_config(
        dict(
            problem="nesterov-chain",
            depth=4,
            dim=16,
            optimizer="gd",
            lr=0.01,
            iterations=3,
            executor="simulated",
            stages=4,
            schedule=schedule,
            machine=path,
            wait="sleep",
            eval_every=0,
            progress="off",
        )
    )
    res = run(cfg, MPI.COMM_SELF)
    per = closed_form(schedule, 4, 1, T_F, T_B, ALPHA + 16 * 8 * BETA)
    np.testing.assert_allclose(res.column("pipeline_time"), per * np.arange(1, 4), rtol=1e-14)
    # a profile with alpha x 10 predicts another time: the costs really come from the file
    path10 = write(tmp_path, profile_data(alpha=10 * ALPHA), "alpha10.toml")
    res10 = run(make_config({**cfg.__dict__, "machine": path10}), MPI.COMM_SELF)
    assert res10.column("pipeline_time")[0] > per + 6 * 8 * ALPHA


def test_without_a_profile_the_model_clock_stays_in_tau():
    cfg = make_config(
        dict(problem="nesterov-chain", depth=4, dim=16, optimizer="gd", iterations=2,
             executor="simulated", stages=4, eval_every=0, progress="off")
    )  # fmt: skip
    res = run(cfg, MPI.COMM_SELF)
    assert res.column("pipeline_time")[0] == closed_form("gpipe", 4, 1, 1.0, 1.0, 0.0)


def test_the_result_file_records_the_profile(tmp_path):
    path = write(tmp_path, profile_data())
    out = tmp_path / "r.h5"
    cfg = make_config(
        dict(problem="nesterov-chain", depth=4, dim=16, optimizer="gd", iterations=2,
             executor="simulated", stages=4, machine=path, output=str(out), progress="off")
    )  # fmt: skip
    run(cfg, MPI.COMM_SELF)
    r = load_result(str(out))
    assert r.attrs["machine_profile"] == (tmp_path / "machine.toml").read_text()
    assert r.attrs["model_time_unit"] == "s"
    assert r.config["machine"] == path


def test_validate_refuses_tau_costs_beside_a_profile(tmp_path):
    path = write(tmp_path, profile_data())
    base = dict(problem="nesterov-chain", depth=4, dim=16, machine=path)
    for key in ("t_forward", "alpha"):
        with pytest.raises(ConfigError, match=key):
            make_config({**base, key: 0.5})
    validate(make_config(base), 4)  # the profile's 4 ranks


# ---------------------------------------------------------------- the command line
def hpcpipe(*args, cwd=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
    )


def test_run_refuses_a_missing_malformed_or_incompatible_profile(tmp_path):
    good = profile_data()
    other_mpi = write(tmp_path, profile_data(library="Open MPI v5.0.0"), "openmpi.toml")
    eight = write(tmp_path, profile_data(ranks=8), "eight.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text(dumps(good).replace("[message.busy]", "[message.busy"))
    cases = [
        (str(tmp_path / "none.toml"), "no such file"),
        (str(bad), "not valid TOML"),
        (other_mpi, "machine.mpi_library"),
        (eight, "placement.ranks = 8"),
    ]
    for path, field in cases:
        out = tmp_path / "r.h5"
        p = hpcpipe(
            "run", "--problem", "nesterov-chain", "--depth", "4", "--dim", "16",
            "--executor", "simulated", "--stages", "4", "--machine", path,
            "--output", str(out),
        )  # fmt: skip
        err = p.stderr.strip()
        assert p.returncode == 2, (path, p.stdout, p.stderr)
        assert field in err and len(err.splitlines()) == 1 and "Traceback" not in err
        assert not out.exists()


def test_calibrate_refuses_bad_input_before_launching(tmp_path):
    kept = tmp_path / "m.toml"
    kept.write_text("mine")
    cases = [
        (["--np", "1", "--output", str(tmp_path / "a.toml")], "ranks >= 2"),
        (["--np", "2", "--output", str(kept)], "exists"),
        (["--np", "2", "--output", str(tmp_path / "no" / "m.toml")], "does not exist"),
        (["--np", "2", "--output", str(tmp_path / "a.toml"), "--wait", "nap"], "--wait"),
    ]
    for args, what in cases:
        p = hpcpipe("calibrate", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert what in p.stderr and "Traceback" not in p.stderr
    assert kept.read_text() == "mine"


def test_calibrate_writes_a_profile_that_a_run_accepts(tmp_path):
    """A short calibration on 2 ranks (sleep policy, one layer kind): its profile reads
    back, has positive figures, and a run of 2 stages uses it (no figure is asserted
    against a speed: the machine may be loaded)."""
    out = tmp_path / "m.toml"
    p = hpcpipe(
        "calibrate", "--np", "2", "--output", str(out), "--wait", "sleep", "--kinds",
        "orthogonal", "--width", "16", "--layer-time", "0.001", "--budget", "0.2",
        "--sizes", "8,4096",
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    prof = read(str(out))
    assert prof.ranks == 2 and prof.mpi_library == LIBRARY
    m = prof.message("sleep")
    assert m.sizes == (8, 4096) and all(h > 0 for h in m.hop_seconds) and m.wakeup > 0
    assert prof.layer("orthogonal", 16).forward > 0 and prof.emulated.sleep >= 0.001
    r = hpcpipe(
        "run", "--problem", "nesterov-chain", "--depth", "2", "--dim", "16", "--iterations",
        "2", "--executor", "simulated", "--stages", "2", "--wait", "sleep", "--machine",
        str(out), "--layer-time", "0", "--no-output", "--progress", "off",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- the engine's action overhead
O = 150e-6


def test_the_action_overhead_is_charged_per_stage_action(tmp_path):
    data = profile_data()
    data["message"]["sleep"]["action_overhead"] = O
    prof = read(write(tmp_path, data))
    spec = ModelSpec("orthogonal", depth=4, d_in=16, d_out=16)
    one = prof.cost_model(spec, rows=1, policy="sleep", layer_time=0.002)
    assert one.t_forward == pytest.approx((T_F + SLEEP + O,) * 4, rel=1e-15)
    two = prof.cost_model(spec, rows=1, policy="sleep", layer_time=0.002, stages=2)
    assert two.t_backward == pytest.approx((T_B + SLEEP + O / 2,) * 4, rel=1e-15)
    assert prof.cost_model(spec, rows=1, policy="busy").t_forward == (T_F,) * 4  # not measured


@pytest.mark.parametrize("overhead", [0.0, O])
def test_calibration_recovers_a_planted_action_overhead(overhead):
    """The fit o = (measured − model)/(2(K + P − 1)) returns the overhead a machine that
    follows the model with o per action would show, and 0 when it has none."""
    from hpcpipe.machine.calibrate import action_overhead

    P, K, w = 4, 4, 16
    data = profile_data(ranks=P)
    c = ALPHA + BETA * w * 8
    base = closed_form("gpipe", P, K, T_F + SLEEP, T_B + SLEEP, c)
    machine = closed_form("gpipe", P, K, T_F + SLEEP + overhead, T_B + SLEEP + overhead, c)
    got = action_overhead(data, "sleep", machine, w, K)
    assert got == pytest.approx(overhead, abs=1e-12)
    assert machine - base == pytest.approx(2 * (K + P - 1) * overhead, rel=1e-9)


def test_bench_pipeline_refuses_a_profile_of_other_ranks_in_one_line(tmp_path):
    path = write(tmp_path, profile_data(ranks=8))
    p = hpcpipe(
        "bench", "pipeline", "--np", "2", "--layer-time", "0.002", "--wait", "sleep",
        "--machine", path, "--repeats", "1",
    )  # fmt: skip
    err = p.stderr.strip()
    assert p.returncode == 2, p.stdout + p.stderr
    assert "placement.ranks = 8" in err and len(err.splitlines()) == 1, err


def test_a_library_name_with_control_characters_makes_a_readable_profile(tmp_path):
    """Open MPI's version string ends in a NUL, which TOML does not allow in a string:
    library_name drops it, and the writer escapes any control character left."""
    assert "\x00" not in library_name() and library_name() == library_name().strip()
    data = profile_data(library="Open MPI v5.0.11, Sep 16, 2026\x00\x01")
    prof = parse(dumps(data))
    assert prof.mpi_library == "Open MPI v5.0.11, Sep 16, 2026\x00\x01"


@pytest.mark.parametrize(
    "raw, name",
    [
        (
            "Open MPI v5.0.11, package: Open MPI, Sep 16, 2026\x00",
            "Open MPI v5.0.11, package: Open MPI, Sep 16, 2026",
        ),
        ("Open\x00 MPI v4.1.2\x00\x00", "Open MPI v4.1.2"),
        (
            "\x00\n  MPICH Version:      5.0.2\nMPICH Release date: Fri\n",
            "MPICH Version:      5.0.2",
        ),
        ("\x00", ""),
    ],
)
def test_the_clean_library_name_drops_nul_characters_and_keeps_the_first_line(raw, name):
    """Open MPI's Get_library_version() string carries NUL characters (its C terminator);
    results, bench records, hpcpipe info and profiles all use the one cleaned name."""
    assert clean_library_name(raw) == name


def test_every_record_uses_the_one_clean_library_name(monkeypatch, capsys):
    """Results' provenance, the bench records and hpcpipe info print the cleaned name."""
    from hpcpipe.bench.common import mpi_library
    from hpcpipe.cli.commands import info
    from hpcpipe.run.results import versions

    monkeypatch.setattr(MPI, "Get_library_version", lambda: "Open MPI v5.0.11\x00")
    assert versions()["mpi"] == "Open MPI v5.0.11"
    assert mpi_library() == "Open MPI v5.0.11"
    assert info.run(None, [], []) == 0
    assert "MPI: Open MPI v5.0.11\n" in capsys.readouterr().out


ALIGN = """
import time
from mpi4py import MPI
from hpcpipe.pipeline.clocks import align_wall_clocks
comm = MPI.COMM_WORLD
origin = align_wall_clocks(comm)
# a message stamped on rank 0's clock reads a non-negative latency on every other rank
if comm.rank == 0:
    for r in range(1, comm.size):
        time.sleep(0.005)
        comm.send(time.perf_counter() - origin, dest=r)
else:
    sent = comm.recv(source=0)
    assert time.perf_counter() - origin - sent >= 0.0
origins = comm.gather(origin, root=0)
if comm.rank == 0:
    print(" ".join(repr(o) for o in origins), flush=True)
"""


def test_ranks_of_one_host_share_rank0s_clock_exactly(tmp_path):
    """On one host every rank reads rank 0's CLOCK_MONOTONIC: the aligned origin is rank
    0's own reading on every rank (no ping-pong estimate, whose error on an
    oversubscribed host reached milliseconds and made a calibration's wake-up negative),
    so a one-way latency is never below 0. Four ranks on the 2-core machine."""
    import time as _time

    from hpcpipe.cli.launch import mpiexec_command

    if "CLOCK_MONOTONIC" not in _time.get_clock_info("perf_counter").implementation:
        pytest.skip("perf_counter is not CLOCK_MONOTONIC here")
    script = tmp_path / "align.py"
    script.write_text(ALIGN)
    p = subprocess.run(
        mpiexec_command(4, [str(script)]), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    origins = [float(word) for word in p.stdout.split()]
    assert len(origins) == 4 and len(set(origins)) == 1, p.stdout
