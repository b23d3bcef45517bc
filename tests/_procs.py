"""What the kill, crash and disk-full tests share: the environment of the processes they
start, a small PPRS run that saves often, its command-line form, and ``hpcpipe`` run as a
subprocess under a hang guard."""

from __future__ import annotations

import os
import subprocess
import sys

# one BLAS thread per process: the tests start several processes on a shared machine
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

# a PPRS run small enough to kill and resume in a second, saving every 2 iterations
SMALL = dict(
    problem="l1-chain",
    depth=2,
    dim=6,
    optimizer="pprs",
    samples=2,
    gamma=0.05,
    lr=0.05,
    iterations=8,
    flush_every=2,
    clock="model",
    progress="off",
)


def cli_args(settings: dict) -> list[str]:
    """``settings`` as ``hpcpipe run`` options (``--key value`` pairs)."""
    return [w for k, v in settings.items() for w in (f"--{k}", str(v))]


def hpcpipe(*args, timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """``python -m hpcpipe ARGS`` with ``ENV``, its output captured, stopped after
    ``timeout`` seconds (a hang guard: subprocess.TimeoutExpired fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
    )
