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
