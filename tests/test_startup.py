"""Start-up: what ``import hpcpipe``, the launcher and a rank import.

Every rank of a job pays its imports: scipy.stats alone costs about 0.4 s of
start-up per process, and a thousand ranks importing it from a shared file
system stall a job's start. These tests pin which packages each entry path
imports (sys.modules and ``python -X importtime``, in fresh processes), never
how fast the machine is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpcpipe.cli.launch import mpiexec_command

HEAVY = ("scipy", "sklearn", "matplotlib", "pandas", "pyarrow")


def _loaded_after(code: str) -> set[str]:
    """Top-level packages in sys.modules after running ``code`` in a fresh interpreter."""
    report = "import json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    probe = f"{code}\n{report}"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout.splitlines()[-1]))


def _imported(importtime_stderr: str) -> set[str]:
    """Top-level packages named in ``python -X importtime`` output."""
    out = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            out.add(name.split(".")[0])
    return out


def test_import_hpcpipe_pulls_in_no_heavy_package():
    loaded = _loaded_after("import hpcpipe")
    assert not loaded & {*HEAVY, "numpy", "mpi4py", "h5py"}, sorted(loaded)


def test_public_names_still_resolve_on_first_use():
    loaded = _loaded_after(
        "import hpcpipe\n"
        "from hpcpipe import RegistryError, register_optimizer, register_problem, "
        "register_schedule\n"
        "assert callable(register_problem) and callable(register_optimizer)\n"
        "assert callable(register_schedule) and issubclass(RegistryError, ValueError)\n"
        "assert {'register_problem', 'register_schedule'} <= set(dir(hpcpipe))\n"
        "try:\n    hpcpipe.no_such_name\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit('no AttributeError')"
    )
    assert "numpy" in loaded  # the registries themselves were imported on use
    assert not loaded & set(HEAVY), sorted(loaded)


def test_registries_and_settings_import_no_scipy_and_no_mpi():
    """The launching process reads every registry (names, choices, checks) and parses the
    command line; it must not import scipy, nor initialise MPI by importing mpi4py."""
    loaded = _loaded_after(
        "from hpcpipe.cli.main import build_parser\n"
        "from hpcpipe.problems import PROBLEMS\n"
        "assert {'l1-chain', 'nesterov-chain', 'pinball-chain', 'attack'} <= set(PROBLEMS)\n"
        "build_parser()"
    )
    assert not loaded & {*HEAVY, "mpi4py", "h5py"}, sorted(loaded)


def _rank_imports(tmp_path, *settings: str, np_: int = 2) -> set[str]:
    """Top-level packages imported by any rank of ``hpcpipe run`` (``python -X importtime``
    on every rank: the lines of all ranks together)."""
    env = dict(os.environ, HPCPIPE_INSIDE_MPI="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    args = ["-X", "importtime", "-m", "hpcpipe", "run", *settings, "--iterations", "1"]
    cmd = mpiexec_command(np_, [*args, "--no-output"])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "status complete" in p.stdout, p.stdout
    assert p.stderr.count("import time: self [us]") == np_, p.stderr[-2000:]  # every rank logged
    return _imported(p.stderr)


def test_a_rank_of_a_run_that_needs_no_scipy_never_imports_it(tmp_path):
    """The default problem (l1-chain: the variable is the input, no weight gradient) on two
    ranks of the MPI engine, without an output file: no rank imports scipy or h5py."""
    mods = _rank_imports(tmp_path, "--depth", "2")
    assert {"hpcpipe", "mpi4py", "numpy"} <= mods, sorted(mods)
    assert not mods & {*HEAVY, "h5py"}, sorted(mods & {*HEAVY, "h5py"})


def test_the_rank_import_check_sees_scipy_where_a_run_needs_it(tmp_path):
    """The same check fails when scipy is needed: the simulated pipeline's orthogonal chain
    uses LAPACK's QR from scipy, imported on that path only."""
    mods = _rank_imports(tmp_path, "--depth", "2", "--executor", "simulated", np_=1)
    assert "scipy" in mods


def test_problem_names_are_listed_without_importing_their_modules():
    """Every built-in problem is a name at once; its module is imported at its first lookup."""
    loaded = _loaded_after(
        "import sys\n"
        "from hpcpipe.problems import BUILTIN, PROBLEMS\n"
        "assert PROBLEMS.names() == list(BUILTIN), PROBLEMS.names()\n"
        "assert 'fewshot' in PROBLEMS and PROBLEMS.check('l1-chain') is None\n"
        "assert 'hpcpipe.problems.digits' not in sys.modules\n"
        "assert 'hpcpipe.problems.worstcase' not in sys.modules\n"
        "import hpcpipe.problems.chains as chains\n"
        "assert PROBLEMS.get('l1-chain') is chains.ENTRIES['l1-chain']\n"
        "assert PROBLEMS.get('l1-chain') is PROBLEMS.get('l1-chain')\n"
        "assert 'hpcpipe.problems.digits' not in sys.modules"
    )
    assert not loaded & set(HEAVY), sorted(loaded)


def test_the_builtin_problem_table_is_the_modules_entries_in_order():
    """BUILTIN (name -> module) is what the modules define, so no problem is lost or
    misplaced by registering names before importing their modules."""
    import importlib

    from hpcpipe.problems import BUILTIN, PROBLEMS

    defined = {}
    for module in dict.fromkeys(BUILTIN.values()):
        for name, entry in importlib.import_module(f"hpcpipe.problems.{module}").ENTRIES.items():
            defined[name] = (module, entry)
    assert list(BUILTIN) == list(defined)
    for name, (module, entry) in defined.items():
        assert BUILTIN[name] == module
        assert PROBLEMS.get(name) is entry


def test_a_lazy_registry_entry_is_made_once_and_only_when_looked_up():
    from hpcpipe.registry import Registry, RegistryError

    made = []
    reg: Registry[str] = Registry("thing")
    reg.register("eager", "e")
    reg.register_lazy("lazy", lambda: made.append(1) or "l")
    assert reg.names() == ["eager", "lazy"] and "lazy" in reg and made == []
    assert reg.get("lazy") == "l" and reg.get("lazy") == "l" and made == [1]
    with pytest.raises(RegistryError, match="already registered"):
        reg.register_lazy("lazy", lambda: "again")


def test_weight_gradients_import_blas_at_set_up_and_accumulate_exactly():
    """scipy's dgemm is imported by the first weight gradient, or at the set-up of an executor
    whose variable is the weights (not inside its first timed call); gw += xᵀdy either way."""
    loaded = _loaded_after(
        "import sys\n"
        "import numpy as np\n"
        "from hpcpipe.model.layers import accumulate_outer\n"
        "from hpcpipe.model.stages import ModelSpec, random_batch\n"
        "from hpcpipe.pipeline.simulated import SimulatedPipeline\n"
        "assert 'scipy' not in sys.modules\n"
        "spec = ModelSpec('mlp', depth=2, d_in=3, d_out=2, width=4, head='squared', seed=1)\n"
        "batch = random_batch(spec, 2)\n"
        "SimulatedPipeline(spec, batch, 'input')\n"
        "assert 'scipy' not in sys.modules\n"
        "SimulatedPipeline(spec, batch, 'weights')\n"
        "assert 'scipy.linalg.blas' in sys.modules\n"
        "rng = np.random.default_rng(0)\n"
        "x, dy = rng.standard_normal((4, 5)), rng.standard_normal((4, 3))\n"
        "for dtype in (np.float64, np.float32):\n"
        "    gw = rng.standard_normal((5, 3)).astype(dtype)\n"
        "    want = gw + (x.T @ dy).astype(dtype)\n"
        "    accumulate_outer(gw, x.astype(dtype), dy.astype(dtype))\n"
        "    np.testing.assert_allclose(gw, want, rtol=1e-6 if dtype == np.float32 else 1e-13)"
    )
    assert "scipy" in loaded
