"""The README's own examples run as written."""

import os
import re
import subprocess
from pathlib import Path

from hpcpipe.cli.launch import mpiexec_command

README = Path(__file__).resolve().parent.parent / "README.md"


def test_oracle_example_runs_on_4_ranks_and_frees_its_requests(tmp_path):
    """'One oracle call': under mpiexec -n 4, one line of output and not one MPICH warning
    (an engine left open prints "freeing inactive persistent request" per request at exit)."""
    text = README.read_text()
    section = text[text.index("### One oracle call") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "script.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = mpiexec_command(4, [str(script)])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "MPICH" not in p.stderr and "persistent request" not in p.stderr, p.stderr
    loss, time = (float(x) for x in p.stdout.split())
    assert loss > 0 and time > 0


def _module_table() -> list[str]:
    text = README.read_text()
    block = text[text.index("## What is in the box") : text.index("### One oracle call")]
    return [line for line in block.splitlines() if line.startswith("| `")]


def test_module_table_names_every_module_and_only_modules_that_exist():
    """Each module of the package is in the README's table (by its dotted name, or by its
    name in its package's row), and every dotted name there imports."""
    import importlib

    rows = _module_table()
    named = set(re.findall(r"`(hpcpipe(?:\.\w+)+)`", "\n".join(rows)))
    for name in sorted(named):
        importlib.import_module(name)
    package = README.parent / "hpcpipe"
    missing = []
    for path in sorted(package.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        dotted, parent, stem = ".".join(parts), ".".join(parts[:-1]), parts[-1]
        in_row = any(
            (f"`{parent}`" in row or f"`{parent}." in row)
            and (f"`{stem}`" in row or f"`.{stem}`" in row)
            for row in rows
        )
        if dotted not in named and not in_row:
            missing.append(dotted)
    assert not missing, f"modules missing from the README's table: {missing}"
