"""Users' own parts, from modules outside the hpcpipe package: the code of docs/extending.md.

The modules are the blocks of docs/extending.md marked ``# file: NAME``,
written to a temporary folder put on PYTHONPATH, so the page and the tested
code cannot differ.
"""

import json
import os
import re
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI
from test_reliability import RUN, assert_sigterm_then_resume_bitwise
from test_reliability import hpcpipe as hp

import hpcpipe
from hpcpipe.cli.main import main
from hpcpipe.model.reference import Reference
from hpcpipe.optim import GD, OPTIMIZERS
from hpcpipe.pipeline.executors import EXECUTORS
from hpcpipe.pipeline.schedules import SCHEDULES
from hpcpipe.problems import PROBLEMS
from hpcpipe.run.config import make_config
from hpcpipe.run.results import load
from hpcpipe.run.runner import make_problem, run

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "extending.md"
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
SELF = MPI.COMM_SELF


def doc_files() -> dict[str, str]:
    blocks = re.findall(r"```python\n# file: (\S+)\n(.*?)```", DOC.read_text(), re.S)
    return {name: code for name, code in blocks}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """The documented modules in a folder of their own, importable here and in subprocesses."""
    d = tmp_path_factory.mktemp("userparts")
    files = doc_files()
    assert set(files) == {"my_model.py", "my_optim.py"}
    for name, code in files.items():
        (d / name).write_text(code)
    (d / "fixed_depth.py").write_text(
        "from my_model import Problem, TanhNet, data\n\n\n"
        "def five(cfg, comm):\n"
        "    model = TanhNet(5, 3, 2, cfg.width, cfg.seed)\n"
        "    size = sum(model.block_size(b) for b in range(5))\n"
        "    return Problem('five', model, data(cfg.m, cfg.seed), 'weights', size)\n"
    )
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))


def env_with(d: Path) -> dict:
    return dict(ENV, PYTHONPATH=os.pathsep.join([str(d), ENV.get("PYTHONPATH", "")]))


MODEL = dict(problem="my_model:problem", depth=8, width=5, m=4, seed=3)


def test_documented_layer_and_head_match_central_finite_differences(user_dir):
    prob = make_problem(make_config(MODEL), SELF)
    ref = Reference(prob.spec, prob.batch, prob.variable, seed=3)
    w = ref.initial_point()
    loss, g = ref.loss_and_grad(w)
    assert prob.spec.depth == 8 and [type(x).__name__ for x in ref.model.layers[:2]] == [
        "Dense",
        "Tanh",
    ]
    h, fd = 1e-6, np.zeros_like(w)
    for i in range(w.size):
        e = np.zeros_like(w)
        e[i] = h
        fd[i] = (ref.loss(w + e) - ref.loss(w - e)) / (2 * h)
    assert np.abs(g).max() > 1e-3
    assert np.abs(fd - g).max() <= 1e-6 * max(1.0, np.abs(g).max())
    # the Huber head is exercised in both of its regimes at this point
    head, z = ref.model.head, ref.model.layers
    out = prob.batch.x
    for layer, p in zip(z, ref.model.views(w)):
        out = layer.forward(out, p)[0]
    r = np.abs(out - prob.batch.targets)
    assert (r <= head.delta).any() and (r > head.delta).any()


def reference_gd(prob, lr: float, iterations: int, seed: int):
    """GD on the single-process reference: the losses and the final weights."""
    ref = Reference(prob.spec, prob.batch, prob.variable, seed=seed)
    opt = GD(lr)
    ident = lambda v: v  # noqa: E731
    state, losses = opt.init(ref.initial_point(), ident), []
    for it in range(1, iterations + 1):
        y = opt.point(state, ident)
        f, g = ref.loss_and_grad(y, 0.0, it, 1)
        losses.append(f.mean())
        state = opt.update(state, y, g, ident)
    return np.array(losses), state["theta"]


@pytest.mark.parametrize("P", [2, 4])
def test_documented_problem_runs_under_mpiexec_and_equals_the_reference(user_dir, tmp_path, P):
    out = tmp_path / "r.h5"
    T, lr = 5, 0.2
    p = hp(
        "run",
        "--np",
        str(P),
        *[f"--{k}={v}" for k, v in MODEL.items()],
        "--optimizer=gd",
        f"--lr={lr}",
        f"--iterations={T}",
        "--schedule=gpipe",
        "--eval_every=0",
        "--progress=off",
        f"--output={out}",
        env=env_with(user_dir),
    )
    assert p.returncode == 0, p.stderr
    r = load(out)
    meta = json.loads(r.attrs["problem"])
    assert (meta["name"], meta["entry"], meta["module"]) == (
        "tanh-huber",
        MODEL["problem"],
        "my_model",
    )
    assert meta["depth"] == 8 and int(r.attrs["n_ranks"]) == P
    want_loss, want_theta = reference_gd(make_problem(make_config(MODEL), SELF), lr, T, 3)
    np.testing.assert_allclose(r.iterations["loss"], want_loss, rtol=1e-12, atol=0)
    with h5py.File(out) as f:
        theta = f["state/optimizer/theta"][()]
    assert np.abs(theta - want_theta).max() <= 1e-12 * np.abs(want_theta).max()
    # model clock, τ = 1 per block and direction: GPipe over P equal stages of 8/P blocks,
    # n = m = 4 items: (n + P − 1)·(t_F + t_B) per call, with t_F = t_B = 8/P
    per_call = (4 + P - 1) * 2 * (8 // P)
    assert r.iterations["pipeline_time"].tolist() == [per_call * t for t in range(1, T + 1)]


def test_a_model_of_another_depth_is_refused(user_dir, tmp_path):
    out = tmp_path / "r.h5"
    p = hp(
        "run",
        "--np",
        "2",
        "--problem=fixed_depth:five",
        "--depth=4",
        "--width=4",
        "--m=2",
        "--optimizer=gd",
        f"--output={out}",
        env=env_with(user_dir),
    )
    assert p.returncode == 2
    assert "depth = 4 is not allowed" in p.stderr and "set depth = 5" in p.stderr
    assert "Traceback" not in p.stderr and not out.exists()


def test_documented_check_refuses_before_any_work(user_dir, capsys):
    assert main(["validate", *[f"--{k}={v}" for k, v in MODEL.items()], "--width=99"]) == 2
    assert "width = 99 is not allowed: tanh-huber is a small model" in capsys.readouterr().err


def test_registered_by_name_in_python_and_recorded(user_dir, tmp_path):
    import my_model
    import my_optim

    if "tanh-huber" not in PROBLEMS:
        hpcpipe.register_problem("tanh-huber", my_model.problem)
        hpcpipe.register_optimizer("heavy-ball", my_optim.HeavyBall)
    out = tmp_path / "r.h5"
    cfg = make_config(
        {
            **MODEL,
            "problem": "tanh-huber",
            "optimizer": "heavy-ball",
            "momentum": "0.5",
            "iterations": 4,
            "progress": "off",
            "output": str(out),
        }
    )
    res = run(cfg, SELF)
    assert res.status == "complete" and len(res.table) == 4
    r = load(out)
    assert json.loads(r.attrs["problem"])["module"] == "my_model"
    method = json.loads(r.attrs["method"])
    assert (method["name"], method["beta"], method["module"]) == ("heavy-ball", 0.5, "my_optim")
    with pytest.raises(hpcpipe.RegistryError, match="already registered"):
        hpcpipe.register_problem("tanh-huber", my_model.problem)


def test_documented_optimizer_resumes_bitwise_after_sigterm(user_dir, tmp_path):
    heavy = ["--optimizer", "my_optim:HeavyBall", "--momentum", "0.5", "--lr", "0.01"]
    common = [*RUN[: RUN.index("--optimizer")], *heavy, "--progress", "off"]
    # a name the file records is imported on resume only when given again (never from the file)
    assert_sigterm_then_resume_bitwise(
        tmp_path, common, env=env_with(user_dir), resume_args=heavy[:2]
    )
    with h5py.File(tmp_path / "part.h5") as f:
        assert sorted(f["state/optimizer"]) == ["theta", "velocity"]
        assert json.loads(f["state/optimizer_scalars"].attrs["names"]) == ["steps"]
        assert f["state/optimizer_scalars"][()].tolist() == [300.0]


@pytest.mark.parametrize(
    ("key", "registry"),
    [
        ("problem", PROBLEMS),
        ("optimizer", OPTIMIZERS),
        ("executor", EXECUTORS),
        ("schedule", SCHEDULES),
    ],
)
def test_cli_choices_equal_the_registries(key, registry, capsys):
    assert main(["validate", f"--{key}=nope"]) == 2
    err = capsys.readouterr().err
    listed = re.search(r"choose one of (.*), or package\.module:attribute", err).group(1)
    own = [n for n in registry.names() if ":" not in n]  # without users' module:attr names
    assert listed.split(", ") == own
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    helptext = "".join(capsys.readouterr().out.split())  # argparse wraps lines at hyphens
    want = f"one of: {', '.join(own)}, or package.module:attribute"
    assert "".join(want.split()) in helptext
    builtin = {
        "problem": {"l1-chain", "max-chain", "quad-chain", "attack", "fewshot"},
        "optimizer": {"gd", "agd", "pprs"},
        "executor": {"mpi", "simulated"},
        "schedule": {"sequential", "gpipe", "1f1b"},
    }[key]
    assert builtin <= set(registry.names())


def test_unimportable_part_is_a_config_error(capsys):
    assert main(["validate", "--optimizer=no_such_module:Thing"]) == 2
    err = capsys.readouterr().err
    assert "cannot import module 'no_such_module'" in err and "Traceback" not in err
