"""Optional packages: one line naming the extra when one is missing, exit 2, no traceback.

A package's absence is simulated in a fresh interpreter by ``sys.modules[name] = None``
(what Python does for a package it cannot import), so these tests run on a machine where
every extra is installed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

from hpcpipe.optional import EXTRAS, MissingExtra, available, need
from hpcpipe.run.config import make_config, tomllib
from hpcpipe.run.runner import run

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = {"matplotlib": "plot", "pandas": "data", "pyarrow": "data", "sklearn": "paper"}


def _without(packages: list[str], code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which ``packages`` cannot be imported."""
    block = "".join(f"sys.modules[{p!r}] = None\n" for p in packages)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{block}{code}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def _cli_without(packages: list[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return _without(
        packages, f"from hpcpipe.cli.main import main\nsys.exit(main({argv!r}))", cwd=cwd
    )


def _one_line(p: subprocess.CompletedProcess, extra: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert f'pip install "hpcpipe[{extra}]"' in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def result_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("optional") / "r.h5"
    cfg = make_config(
        dict(problem="l1-chain", depth=2, dim=4, iterations=3, output=str(path), progress="off")
    )
    run(cfg, MPI.COMM_SELF)
    return path


def test_need_imports_a_present_package_and_names_the_extra_of_a_missing_one(tmp_path):
    assert need("json", "plot").dumps([1]) == "[1]"
    p = _without(
        ["matplotlib"],
        "from hpcpipe.optional import MissingExtra, need\n"
        "try:\n    need('matplotlib.pyplot', 'plot', 'a figure')\n"
        "except MissingExtra as e:\n    print(e)\n",
        cwd=tmp_path,
    )
    assert p.stdout.strip() == 'a figure needs matplotlib: pip install "hpcpipe[plot]"', p
    p = _without(
        ["sklearn"],
        "from hpcpipe.optional import available, need\n"
        "print(available('sklearn'), available('json'))\n"
        "try:\n    need('sklearn.datasets', 'paper')\n"
        "except ImportError as e:\n    print(type(e).__name__, e)\n",
        cwd=tmp_path,
    )
    assert p.stdout.splitlines() == [
        "False True",
        'MissingExtra this needs scikit-learn: pip install "hpcpipe[paper]"',
    ], p


def test_a_broken_installed_package_keeps_its_own_error(tmp_path, monkeypatch):
    """Only the package's own absence means 'install the extra': a package that is there but
    fails on one of its own imports raises that error, so the real cause is not hidden."""
    pkg = tmp_path / "brokenpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import no_such_dependency_of_brokenpkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as err:
        need("brokenpkg", "plot")
    assert not isinstance(err.value, MissingExtra)
    assert err.value.name == "no_such_dependency_of_brokenpkg"
    with pytest.raises(ValueError, match="unknown extra"):
        need("no_such_package_at_all", "plots")


def test_plot_without_matplotlib_is_one_line_and_writes_nothing(result_file, tmp_path):
    png = tmp_path / "g.png"
    argv = ["plot", "timeline", str(result_file), "-o", str(png)]
    p = _cli_without(["matplotlib"], argv, tmp_path)
    line = _one_line(p, "plot")
    assert line.startswith("hpcpipe plot: ") and "matplotlib" in line
    assert not png.exists()


def test_simulate_plot_without_matplotlib_is_one_line(tmp_path):
    png = tmp_path / "g.png"
    p = _cli_without(["matplotlib"], ["simulate", "gpipe", "--plot", str(png)], tmp_path)
    _one_line(p, "plot")
    assert not png.exists()


def test_analyze_without_matplotlib_stops_before_any_work(result_file, tmp_path):
    out = tmp_path / "report"
    p = _cli_without(["matplotlib"], ["analyze", str(result_file.parent), "-o", str(out)], tmp_path)
    _one_line(p, "plot")
    assert p.stdout == "" and not out.exists()


def test_digits_problems_and_demo_without_scikit_learn_stop_before_launch(tmp_path):
    for problem in ("attack", "attack-targeted", "fewshot"):
        p = _cli_without(
            ["sklearn"], ["run", "--np", "2", "--problem", problem, "--no-output"], tmp_path
        )
        line = _one_line(p, "paper")
        assert f"problem = {problem!r}" in line and "scikit-learn" in line, line
    p = _cli_without(["sklearn"], ["demo", "attack", "--np", "2"], tmp_path)
    assert "demo" in _one_line(p, "paper")
    assert not (tmp_path / "runs").exists()


def test_frame_and_parquet_export_without_their_packages(result_file, tmp_path):
    p = _without(
        ["pandas"],
        f"from hpcpipe.run.results import load\nload({str(result_file)!r}).frame()",
        cwd=tmp_path,
    )
    assert p.returncode != 0
    assert 'Result.frame() needs pandas: pip install "hpcpipe[data]"' in p.stderr, p.stderr
    p = _cli_without(
        ["pyarrow"],
        ["export", str(result_file), "--format", "parquet", "-o", str(tmp_path / "t")],
        tmp_path,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert 'pip install "hpcpipe[data]"' in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == []


def test_optional_packages_are_imported_only_through_need():
    """No module of hpcpipe imports matplotlib, pandas, pyarrow or scikit-learn directly, at
    the top or inside a function: every import goes through ``need``, whose message names
    the extra."""
    direct = []
    for path in sorted((ROOT / "hpcpipe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                if n.split(".")[0] in OPTIONAL:
                    direct.append(f"{path.relative_to(ROOT)}:{node.lineno} {n}")
    assert not direct, direct


def test_extras_in_pyproject_match_the_helper_and_scikit_learn_is_not_required():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(reqs):
        return {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip() for r in reqs}

    for extra, packages in EXTRAS.items():
        assert names(extras[extra]) == set(packages), (extra, extras[extra])
    hard = names(project["dependencies"])
    assert not hard & {"scikit-learn", "matplotlib", "pandas", "pyarrow"}, hard
    # the tests and the demo (digits) run on `.[mpich,test]`, as the README and CI install
    assert {"matplotlib", "pandas", "scikit-learn"} <= names(extras["test"])
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'python -m pip install ".[mpich,test]"' in ci and "hpcpipe demo" in ci
    assert 'python -m pip install ".[mpich,test]"' in (ROOT / "README.md").read_text()


def test_the_installed_test_extra_has_what_the_tests_use():
    for module in ("matplotlib", "pandas", "sklearn"):
        assert available(module), module
