"""A result file read with plain h5py while its run writes it, as docs/results.md says:
``h5py.File(path, "r", swmr=True, locking=False)``, then ``refresh()`` to see new rows."""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from hpcpipe.run.results import load

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
DEADLINE = 180.0  # bounded waits only: a loaded machine is slow, never a hang
DOC = Path(__file__).resolve().parent.parent / "docs" / "results.md"


def doc_example() -> str:
    """The Python example of the page's "Reading a live result with h5py" section."""
    text = DOC.read_text()
    section = text.split("## Reading a live result with h5py", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _rows(f) -> int:
    """Rows every column holds (the writer extends one column after the other)."""
    group = f["iterations"]
    for name in group:
        group[name].refresh()
    return min(group[name].shape[0] for name in group)


def test_a_live_result_reads_with_plain_h5py_while_the_run_writes(tmp_path):
    out = tmp_path / "live.h5"
    cmd = [sys.executable, "-m", "hpcpipe", "run", "--executor", "simulated"]
    cmd += ["--optimizer", "gd", "--iterations", "10000000", "--flush-every", "2"]
    cmd += ["--progress", "off", "--output", str(out)]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # the documented plain open fails on the writer's lock, the documented one does not
        start = time.monotonic()
        while not out.exists() or out.stat().st_size == 0:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - start < DEADLINE, "the run never created its file"
            time.sleep(0.2)
        seen, first = [], None
        while len(seen) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - start < DEADLINE, f"rows seen: {seen}"
            try:
                f = h5py.File(out, "r", swmr=True, locking=False)
            except OSError:  # the superblock not written yet
                time.sleep(0.2)
                continue
            with f:
                n = _rows(f)
                if n and (not seen or n > seen[-1]):
                    seen.append(n)
                    first = f["iterations/iteration"][:n].copy(), f["iterations/loss"][:n].copy()
                    assert f["iterations/loss"].attrs["units"] == "1"
            time.sleep(0.2)
        printed = io.StringIO()  # the page's example, on this live file
        with contextlib.redirect_stdout(printed):
            exec(doc_example().replace("runs/live.h5", str(out)), {})
        rows, rest = printed.getvalue().split(" rows, ")
        assert int(rows) >= seen[-1] and rest.strip() == "incomplete | pipeline time in tau"
        try:  # without locking=False, HDF5's own lock meets the writer's
            h5py.File(out, "r", swmr=True).close()
            locked = False
        except OSError:
            locked = True
        assert locked
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # stops at the end of the iteration
        proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 143
    r = load(out)
    it, loss = first
    assert r.status == "incomplete" and len(r.iterations["iteration"]) >= len(it)
    np.testing.assert_array_equal(r.iterations["iteration"][: len(it)], it)
    np.testing.assert_array_equal(r.iterations["loss"][: len(it)], loss)
