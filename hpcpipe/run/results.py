"""HDF5 results: one self-describing file per run, readable while it grows.

Written by rank 0 only, in SWMR mode (single writer, multiple readers), and
flushed every few iterations, so a job killed at any point (SIGKILL
included) leaves a file that opens with its flushed iterations and the
status ``incomplete``. Schema (version 3; see docs/results.md). Version 3 added
/state/backup and /state/commit (crash-consistent saves); version 2 files (named
optimizer state, no backup) and version 1 files (state only theta/prev) are read and
resumed too, and a resume brings them to version 3:

    /                      attrs: schema_version, status, config (JSON), config.<key>,
                           method (JSON), problem (JSON), versions, command, n_ranks,
                           hosts (JSON), rank_hosts (JSON), start_time, end_time, clock
    /iterations/<column>   float64 (N,), one dataset per column of runner.Row
    /timeline/<field>      (E,) per recorded action: iteration, rank, stage, kind
                           (0 = F, 1 = B), item (int64); wait, start, end (float64,
                           seconds on the run's clock; wait..start is the receive wait)
    /stages/<field>        (S,) per stage over the recorded iterations: busy, wait,
                           idle (float64 seconds), actions (int64)
    /state/...             what --resume needs: the optimizer's named arrays and
                           scalars, the loop's scalars, per-stage totals

Plain numbers and strings only (no pickles): h5dump, h5py and pandas read it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hpcpipe.errors import ResultsError
from hpcpipe.run import superblock, units

SCHEMA_VERSION = 3
# 1: /state held theta, prev; 2: named optimizer state (state/optimizer/<name>);
# 3: /state/backup and /state/commit (a save cut short resumes from the backup). A reader
# of schema 2 would resume a file of schema 3 from a half-rewritten /state: it refuses it.
STATUSES = ("complete", "incomplete", "diverged", "failed")
TIMELINE_INT = ("iteration", "rank", "stage", "kind", "item")
TIMELINE_FLOAT = ("wait", "start", "end")
STAGE_FIELDS = ("busy", "wait", "idle", "actions")


# the oldest file format that has SWMR (HDF5 1.10): readers as old as h5dump 1.10 read the
# files; "latest" alone would let a newer HDF5 write messages they cannot parse (the
# Fletcher-32 filter pipeline of HDF5 2.0 made h5dump 1.10.8 fail with "internal error")
LIBVER = ("v110", "latest")
SUM = {"fletcher32": True}  # every dataset: HDF5's Fletcher-32 checksum of each chunk
BACKUP, COMMIT = "backup", "commit"  # /state/backup: the previous state; /state/commit: which
STATE_ABOUT = (
    "state at the last flush, for --resume: optimizer/<name> (the optimizer's "
    "arrays, full vectors), optimizer_scalars (its scalars, names in the "
    "attribute 'names'), scalars = [next iteration, best f, pipeline time, "
    "first loss], stage = per-stage totals [busy, wait, idle, actions]; "
    "backup/ holds the same for the state before it, and commit = [0] says the state "
    "here is whole, [1] that backup/ is the one to resume from (a save was cut short)"
)
NO_CHECKSUMS = (
    "no checksums (written before hpcpipe stored Fletcher-32 checksums): "
    "damage to its data cannot be detected"
)
# called with the name of each step of a save (Writer.save_state, Run.flush): a test hook
SAVE_HOOK = None


class DiskFullError(ResultsError):
    """The disk (or the user's quota) holding a result file is full: ENOSPC or EDQUOT."""


DISK_FULL = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT"}
FREE_SPACE = "free space or choose another --output"


def disk_full(path: str | Path, e: BaseException) -> DiskFullError | None:
    """A DiskFullError naming the file and the fix if ``e`` is ENOSPC or EDQUOT, else None.

    h5py reports HDF5's failed writes without an errno: its message holds the C library's.
    """
    code = getattr(e, "errno", None)
    if code not in DISK_FULL:
        text = str(e)
        code = next((c for c in DISK_FULL if os.strerror(c) in text), None)
    if code is None:
        return None
    return DiskFullError(
        f"{path}: {os.strerror(code)} ({DISK_FULL[code]}) while writing it: {FREE_SPACE}"
    )


_FALLOCATE: list = []


def reserve(fd: int, nbytes: int) -> None:
    """Claim ``nbytes`` of disk after the end of the open file ``fd`` without changing its size.

    Linux ``fallocate(fd, FALLOC_FL_KEEP_SIZE, size, nbytes)``: the writes that follow land
    in blocks that already belong to the file, so a full disk or quota shows here, as an
    OSError (ENOSPC, EDQUOT), before HDF5 has written a byte of them (HDF5's own failed
    writes leave a file that no longer opens). Where the call is missing or the file
    system does not support it, nothing is claimed and HDF5's own errors are what is left.
    """
    if not _FALLOCATE:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
            _FALLOCATE.append((fn, ctypes.get_errno))
        except (OSError, AttributeError):
            _FALLOCATE.append(None)
    if _FALLOCATE[0] is None or nbytes <= 0:
        return
    fn, get_errno = _FALLOCATE[0]
    if fn(fd, 1, os.fstat(fd).st_size, nbytes) != 0:  # 1 = FALLOC_FL_KEEP_SIZE
        code = get_errno()
        if code in DISK_FULL:
            raise OSError(code, os.strerror(code))


def save_point(point: str) -> None:
    """Tell SAVE_HOOK (a test's) that a save reached ``point``."""
    if SAVE_HOOK is not None:
        SAVE_HOOK(point)


def _state_slot(group, state_layout, state_size: int, n_stages: int) -> None:
    """The datasets of one saved state (zeros; next iteration 1 = nothing saved yet)."""
    arrays, names = state_layout
    opt = group.create_group("optimizer")
    for name in arrays:
        opt.create_dataset(name, data=np.zeros(state_size), **SUM)
    sc = group.create_dataset(
        "optimizer_scalars", shape=(len(names),), dtype="f8", chunks=(8,), maxshape=(None,), **SUM
    )
    sc.attrs["names"] = json.dumps(list(names))
    group.create_dataset("scalars", data=np.array([1.0, np.inf, 0.0, np.nan]), **SUM)
    group.create_dataset("stage", data=np.zeros((n_stages, 4)), **SUM)


def _read_slot(group) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """(optimizer arrays, optimizer scalars, loop scalars, stage totals) of one saved state."""
    arrays = {k: group["optimizer"][k][()] for k in group["optimizer"]}
    return arrays, group["optimizer_scalars"][()], group["scalars"][()], group["stage"][()]


def _write_slot(group, arrays: dict, opt_scalars, scalars, stage, point: str) -> None:
    for i, (name, v) in enumerate(arrays.items()):
        group["optimizer"][name][...] = v
        if i == 0:
            save_point(f"{point}-started")
    group["optimizer_scalars"][...] = np.asarray(opt_scalars, dtype=float)
    group["scalars"][...] = np.asarray(scalars, dtype=float)
    group["stage"][...] = stage
    save_point(f"{point}-written")


def committed_slot(state) -> str:
    """Which group of /state holds the state to resume from: "" (/state itself) or backup.

    /state/commit (absent in files written before it: /state itself) is 0 when /state is
    whole and 1 while a save rewrites it, when /state/backup holds the state before it.
    """
    if COMMIT not in state:
        return ""
    c = state[COMMIT][()]
    if c.shape != (1,) or int(c[0]) not in (0, 1):
        raise ValueError(f"state/commit is {c.tolist()!r}, not [0] or [1]")
    return BACKUP if int(c[0]) == 1 else ""


def versions() -> dict:
    import mpi4py

    from hpcpipe import __version__
    from hpcpipe.mpi_library import library_name

    return {
        "hpcpipe": __version__,
        "numpy": np.__version__,
        "mpi4py": mpi4py.__version__,
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "mpi": library_name(),
        "python": sys.version.split()[0],
    }


def slurm_provenance() -> dict:
    keys = (
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_NTASKS",
        "SLURM_TASKS_PER_NODE",
        "SLURM_CPUS_PER_TASK",
    )
    out = {k: os.environ[k] for k in keys if k in os.environ}
    # under mpiexec in a batch job, the ranks see the task layout of hydra's own step (one
    # proxy per node): the job script keeps the job's in HPCPIPE_SLURM_<KEY>
    for k in ("SLURM_NTASKS", "SLURM_TASKS_PER_NODE"):
        if k in out and os.environ.get(f"HPCPIPE_{k}"):
            out[k] = os.environ[f"HPCPIPE_{k}"]
    return out


class LockedError(ResultsError):
    """A result file that a live process is writing."""


def _lock(path: Path, create: bool = False, attempts: int = 10) -> int:
    """An exclusive ``flock`` on the result file itself, held while it is written.

    The kernel drops it when the writer dies (kill -9 included), so a free lock on a file
    whose HDF5 status flags say "open for writing" means its writer is gone. With
    ``create`` the file is made with O_EXCL: of two runs on one path, one wins. A probe
    (``is_locked``) holds the lock for microseconds: the writer tries a few times.
    """
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise ResultsError(
            f"{path} exists: results are never overwritten (another run created it just now?)"
        ) from None
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            time.sleep(0.05 * (attempt < attempts - 1))
    os.close(fd)
    raise LockedError(
        f"{path} is being written by a running process (its lock is held): "
        "wait for it to finish or stop it first"
    )


def is_locked(path: str | Path) -> bool:
    """True while a live process writes the result file (holds its lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def check_unlocked(path: str | Path) -> None:
    """LockedError if a live process writes the result file."""
    if is_locked(path):
        raise LockedError(
            f"{path} is being written by a running process (its lock is held): "
            "wait for it to finish or stop it first"
        )


def recover_truncated(path: str | Path, log=None) -> bool:
    """Repair a file a killed writer left shorter than its end-of-file address; True if done.

    HDF5 records a larger end-of-file address before it writes the file's new tail, so a
    kill -9 in between leaves a file that readers refuse as truncated. Only a resume (its
    writer gone: the file's lock is free) calls this. The file is lengthened to that
    address with zeros (as ``h5clear --increment`` does) only if its superblock says a
    writer left it open, and the extension is kept only if the file then loads as an
    incomplete result: every chunk read passes its Fletcher-32 checksum and the committed
    state is whole (backup/commit). Otherwise the file is cut back to its size, untouched,
    and its readers keep calling it truncated (a file cut by a copy, or by hand).
    ``log`` is told what was done, in one line.
    """
    path = Path(path)
    try:
        sb = superblock.read(path, check_size=False)
        if path.stat().st_size >= sb.eof or not superblock.left_open(sb):
            return False
    except (OSError, superblock.SuperblockError):
        return False
    fd = _lock(path)
    try:
        size = superblock.extend_to_eof(fd, sb)
        try:
            ok = load(path).status == "incomplete"
        except ResultsError:
            ok = False
        if not ok:
            os.ftruncate(fd, size)
            os.fsync(fd)
            return False
    finally:
        os.close(fd)
    if log is not None:
        log(
            f"recovered {path}: its writer was killed while the file grew, leaving "
            f"{size} of the {sb.eof} bytes its superblock records; extended it as h5clear "
            "--increment does (its Fletcher-32 checksums and saved state check out)"
        )
    return True


class Writer:
    """Rank 0's writer of one result file (holding its lock until closed).

    ``with`` closes the file on every path.

    ``state_layout`` = (array names, scalar names) of the optimizer's state,
    saved by ``save_state`` at every flush. Leaving a ``with`` block without
    ``close(status)`` (an exception) closes the file as it stands: status
    ``incomplete``, resumable from its last flush.
    """

    def __init__(
        self,
        path: str | Path,
        attrs: dict,
        columns: tuple[str, ...],
        n_stages: int,
        overwrite: bool = False,
        state_size: int = 0,
        state_layout: tuple[tuple[str, ...], tuple[str, ...]] = (("theta",), ()),
    ):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise ResultsError(f"{self.path} exists: results are never overwritten")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = _lock(self.path, create=not overwrite)
        self.f = h5py.File(self.path, "w", libver=LIBVER, locking=False)
        a = self.f.attrs
        a["schema_version"] = SCHEMA_VERSION
        a["status"] = "incomplete"  # until close() sets the final status
        a["start_time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        a["end_time"] = ""
        a["command"] = os.environ.get("HPCPIPE_COMMAND") or " ".join(sys.argv)
        a["hosts"] = json.dumps(attrs.pop("hosts", [socket.gethostname()]))
        a["versions"] = json.dumps(versions())
        a["slurm"] = json.dumps(slurm_provenance())
        for k, v in attrs.items():
            a[k] = v
        self.columns = columns
        it = self.f.create_group("iterations")
        it.attrs["columns"] = ",".join(columns)
        for c in columns:
            it.create_dataset(c, shape=(0,), maxshape=(None,), chunks=(1024,), dtype="f8", **SUM)
        tl = self.f.create_group("timeline")
        for c in TIMELINE_INT:
            tl.create_dataset(c, shape=(0,), maxshape=(None,), chunks=(4096,), dtype="i8", **SUM)
        for c in TIMELINE_FLOAT:
            tl.create_dataset(c, shape=(0,), maxshape=(None,), chunks=(4096,), dtype="f8", **SUM)
        st = self.f.create_group("stages")
        for c in STAGE_FIELDS:
            st.create_dataset(
                c, data=np.zeros(n_stages, dtype="i8" if c == "actions" else "f8"), **SUM
            )
        rs = self.f.create_group("state")
        rs.attrs["about"] = STATE_ABOUT
        _state_slot(rs, state_layout, state_size, n_stages)
        _state_slot(rs.create_group(BACKUP), state_layout, state_size, n_stages)
        rs.create_dataset(COMMIT, data=np.zeros(1, dtype="i8"), **SUM)
        self._last = _read_slot(rs)
        units.label(self.f)  # every dataset's units attribute (hpcpipe/run/units.py)
        self.f.swmr_mode = True
        self.f.flush()

    @classmethod
    def reopen(
        cls,
        path: str | Path,
        last_iteration: int,
        columns: tuple[str, ...],
        log=None,
        overrides: dict | None = None,
        state_layout: tuple[tuple[str, ...], tuple[str, ...]] = (("theta",), ()),
    ) -> Writer:
        """Continue an incomplete file: drop rows/events after ``last_iteration``.

        A file whose writer died (kill -9, a failed rank) still has its HDF5 status
        flags set; with its lock free, they are cleared here (as ``h5clear -s`` does),
        and ``log`` is told so. ``overrides`` (settings changed on this resume) are
        appended to the ``resume_overrides`` attribute. A schema-1 file's state
        (theta, prev) is moved to the named layout of ``state_layout`` first, and a
        schema-1 or 2 file gets a backup slot and a commit marker, so the continued
        file is a schema-3 file.
        """
        self = cls.__new__(cls)
        self.path, self.columns = Path(path), columns
        self._fd = _lock(self.path)
        try:
            if superblock.clear_status_flags(self.path) and log is not None:
                log(
                    f"recovered {self.path}: its writer stopped without closing it "
                    "(kill -9 or a failed rank); cleared the HDF5 status flags it left "
                    f"(as h5clear -s does); resuming after iteration {last_iteration}"
                )
            self.f = h5py.File(self.path, "r+", libver=LIBVER, locking=False)
        except (OSError, superblock.SuperblockError) as e:
            os.close(self._fd)
            raise ResultsError(f"{self.path}: cannot be reopened to resume ({e})") from None
        if "optimizer" not in self.f["state"]:
            self._upgrade_state(state_layout)
        self._settle_state(state_layout)
        self.f.attrs["status"] = "incomplete"
        self.f.attrs["resumed"] = int(self.f.attrs.get("resumed", 0)) + 1
        if overrides:
            past = json.loads(_text(self.f.attrs.get("resume_overrides", "[]")))
            past.append({"resume": int(self.f.attrs["resumed"]), **overrides})
            self.f.attrs["resume_overrides"] = json.dumps(past)
        n = int(
            np.searchsorted(self.f["iterations"]["iteration"][()], last_iteration, side="right")
        )
        for c in columns:
            self.f["iterations"][c].resize((n,))
        keep = int((self.f["timeline"]["iteration"][()] <= last_iteration).sum())
        for c in TIMELINE_INT + TIMELINE_FLOAT:
            self.f["timeline"][c].resize((keep,))
        units.label(self.f)  # files written before datasets carried units get them
        self.f.swmr_mode = True
        self.f.flush()
        return self

    def _upgrade_state(self, state_layout) -> None:
        st = self.f["state"]
        arrays, names = state_layout
        opt = st.create_group("optimizer")
        for name in arrays:
            opt.create_dataset(
                name, data=st[name][()] if name in st else np.zeros_like(st["theta"])
            )
        for name in ("theta", "prev"):
            if name in st:
                del st[name]
        sc = st.create_dataset("optimizer_scalars", data=np.zeros(len(names)))
        sc.attrs["names"] = json.dumps(list(names))
        self.f.attrs["schema_version"] = SCHEMA_VERSION

    def _settle_state(self, state_layout) -> None:
        """Make /state the committed state again, with a backup slot and a commit marker.

        A save cut short (commit = [1]) left /state half rewritten: the backup is copied
        back first, and only then is the commit marker reset. Files written before the
        backup existed get one (and their /state, which was whole, is committed).
        """
        st = self.f["state"]
        if BACKUP not in st:
            size = st["optimizer"]["theta"].shape[0]
            _state_slot(st.create_group(BACKUP), state_layout, size, st["stage"].shape[0])
            st.attrs["about"] = STATE_ABOUT
        if COMMIT not in st:
            st.create_dataset(COMMIT, data=np.zeros(1, dtype="i8"), **SUM)
        if committed_slot(st) == BACKUP:
            arrays, opt_scalars, scalars, stage = _read_slot(st[BACKUP])
            _write_slot(st, arrays, opt_scalars, scalars, stage, "restore")
            self.f.flush()
            st[COMMIT][...] = 0
        self.f.attrs["schema_version"] = SCHEMA_VERSION
        self._last = _read_slot(st)

    def save_state(self, arrays: dict, opt_scalars: list[float], scalars, stage) -> None:
        """The optimizer's arrays (full vectors) and scalars, the loop's scalars, the stages.

        Crash-consistent: a kill at any moment leaves one whole state to resume from. The
        state saved last is copied to /state/backup and flushed; commit = [1] (resume from
        the backup) is flushed; /state is rewritten and flushed; commit = [0] is flushed.
        The caller flushes the rows the state follows before (Run.flush), so the state
        never runs ahead of the rows.
        """
        st = self.f["state"]
        _write_slot(st[BACKUP], *self._last, "backup")
        self.f.flush()
        save_point("backup-flushed")
        st[COMMIT][...] = 1
        self.f.flush()
        save_point("backup-committed")
        _write_slot(st, arrays, opt_scalars, scalars, stage, "state")
        self.f.flush()
        save_point("state-flushed")
        st[COMMIT][...] = 0
        self.f.flush()
        save_point("state-committed")
        self._last = (
            {k: np.array(v, dtype=float) for k, v in arrays.items()},
            np.asarray(opt_scalars, dtype=float),
            np.asarray(scalars, dtype=float),
            np.array(stage, dtype=float),
        )

    # an injected full disk (config inject_failure 'enospc:ITERATION'): errno, iteration
    fail_at: tuple[int, int] | None = None
    broken = False

    def reserve(self, nbytes: int, iteration: int) -> None:
        """Claim the disk space the next writes need (``reserve``); OSError if it is full.

        ``iteration``: the last one these writes hold, for an injected full disk.
        """
        if self.fail_at is not None and iteration >= self.fail_at[1]:
            code = self.fail_at[0]
            raise OSError(code, f"{os.strerror(code)} (injected: config inject_failure)")
        reserve(self._fd, nbytes)

    def room(self, rows: int, events: int) -> int:
        """Bytes the next append of ``rows`` rows and ``events`` events, a save of the state
        and their flushes may add to the file: each chunk the appends start (HDF5 writes a
        chunk whole, with its checksum; a chunk already started is rewritten in place),
        both state slots, and 64 KiB of metadata.
        """
        total = 64 * 1024
        for group, n in (("iterations", rows), ("timeline", events)):
            for d in self.f[group].values() if n else ():
                c, old = d.chunks[0], d.shape[0]
                touched = -(-(old + n) // c) - -(-old // c)
                total += touched * (c * d.dtype.itemsize + 4)
        state = []
        self.f["state"].visititems(
            lambda _, o: state.append(o.nbytes) if isinstance(o, h5py.Dataset) else None
        )
        return total + 2 * sum(state)

    def abandon(self) -> None:
        """After a failed write: close without another write attempt where HDF5 allows it."""
        self.broken = True

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc) -> None:
        if self.f.id.valid:  # not closed by close(status): leave it incomplete, resumable
            try:
                if not self.broken:
                    self.f.flush()
                self.f.close()
            except (OSError, RuntimeError):
                if not self.broken:
                    raise
            finally:
                os.close(self._fd)

    def _append(self, group: str, data: dict) -> None:
        g = self.f[group]
        n = len(next(iter(data.values())))
        if n == 0:
            return
        for k, v in data.items():
            d = g[k]
            old = d.shape[0]
            d.resize((old + n,))
            d[old:] = v

    def append_iterations(self, rows: np.ndarray) -> None:
        self._append("iterations", {c: rows[:, i] for i, c in enumerate(self.columns)})

    def append_timeline(self, ev: np.ndarray) -> None:
        """ev columns: iteration, rank, stage, kind, item, wait, start, end."""
        names = TIMELINE_INT + TIMELINE_FLOAT
        self._append("timeline", {c: ev[:, i] for i, c in enumerate(names)})

    def set_stages(self, busy, wait, idle, actions) -> None:
        for name, v in zip(STAGE_FIELDS, (busy, wait, idle, actions)):
            self.f["stages"][name][...] = v

    def flush(self) -> None:
        self.f.flush()

    def close(self, status: str, extra: dict | None = None) -> None:
        """End the SWMR session, then set the final status and attributes.

        Readers take no lock, so a reader that happens to have the file open
        (another process checking a sweep's state) cannot make the reopen fail.
        """
        if status not in STATUSES:
            raise ValueError(f"status {status!r}")
        self.f.flush()
        self.f.close()
        try:
            with h5py.File(self.path, "r+", locking=False) as f:  # this process holds the lock
                f.attrs["status"] = status
                f.attrs["end_time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                for k, v in (extra or {}).items():
                    f.attrs[k] = v
        finally:
            os.close(self._fd)


# ---------------------------------------------------------------- reading


@dataclass
class Result:
    """One result file in memory."""

    path: Path
    attrs: dict
    config: dict
    iterations: dict[str, np.ndarray]
    timeline: dict[str, np.ndarray]
    stages: dict[str, np.ndarray]
    info: dict = field(default_factory=dict)
    iteration_columns: tuple[str, ...] = ()
    checksums: bool = True  # False: written before datasets carried Fletcher-32 checksums

    @property
    def status(self) -> str:
        return str(self.attrs["status"]).strip()

    def columns(self, what: str = "iterations") -> dict[str, np.ndarray]:
        """One table's columns in schema order (docs/results.md).

        iterations: the order the writer recorded (the group's ``columns``
        attribute, runner.COLUMNS); timeline: iteration, rank, stage, kind,
        item, wait, start, end; stages: busy, wait, idle, actions. Columns the
        schema does not know come last, in name order.
        """
        if what not in ("iterations", "timeline", "stages"):
            raise ValueError(f"{what!r}: choose iterations, timeline or stages")
        data = getattr(self, what)
        order = {
            "iterations": self.iteration_columns,
            "timeline": TIMELINE_INT + TIMELINE_FLOAT,
            "stages": STAGE_FIELDS,
        }[what]
        names = [c for c in order if c in data] + sorted(c for c in data if c not in order)
        return {c: data[c] for c in names}

    def frame(self, what: str = "iterations"):
        """The iterations, timeline or stages as a pandas DataFrame, columns in schema order.

        The timeline frame adds ``action`` ("F3", "B3"), ``compute`` = end − start
        and ``receive_wait`` = start − wait, in the clock's units.
        """
        from hpcpipe.optional import need

        pd = need("pandas", "data", "Result.frame()")
        df = pd.DataFrame(self.columns(what))
        if what == "timeline":
            kinds = np.array(["F", "B"])
            df["action"] = [f"{kinds[k]}{i}" for k, i in zip(df["kind"], df["item"])]
            df["compute"] = df["end"] - df["start"]
            df["receive_wait"] = df["start"] - df["wait"]
        return df


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


READ_ATTEMPTS = 4  # HDF5's SWMR reader retries a failed metadata read this often (default 100)


def _check_container(path: Path) -> None:
    """Cheap checks before HDF5 sees the file: a complete superblock, its checksum, its size.

    A truncated or damaged file must fail fast: an SWMR reader otherwise retries
    its metadata reads with growing sleeps for minutes.
    """
    try:
        superblock.read(path)
    except superblock.SuperblockError as e:
        raise ResultsError(f"{path}: {e}") from None


def _swmr_fapl():
    """File access properties of an SWMR reader that retries a bad read only a few times.

    h5py does not wrap H5Pset_metadata_read_attempts; it is called through ctypes on the
    HDF5 library h5py loaded. Without it (another platform), HDF5's default applies.
    """
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_LATEST)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    fn = _read_attempts_function()
    if fn is not None:
        fn(fapl.id, READ_ATTEMPTS)
    return fapl


_ATTEMPTS_FN: list = []


def _read_attempts_function():
    if not _ATTEMPTS_FN:
        fn = None
        try:
            import ctypes

            with open("/proc/self/maps") as maps:
                libs = {ln.split()[-1] for ln in maps if "libhdf5" in ln and "_hl" not in ln}
            for lib in sorted(libs):
                cand = getattr(ctypes.CDLL(lib), "H5Pset_metadata_read_attempts", None)
                if cand is not None:
                    cand.argtypes = [ctypes.c_int64, ctypes.c_uint]
                    cand.restype = ctypes.c_int
                    fn = cand
                    break
        except OSError:
            fn = None
        _ATTEMPTS_FN.append(fn)
    return _ATTEMPTS_FN[0]


def _open(path: Path):
    """Open a closed file normally; one still held (or left) by a writer in SWMR mode.

    Readers take no file lock (``locking=False``), so they never block the
    writer of a run that is still going on.
    """
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as e:
        if "already open for write" not in str(e):
            raise
    fapl = _swmr_fapl()
    fapl.set_file_locking(False, True)
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl)
    return h5py.File(fid)


def _json_dict(attrs: dict, key: str, path: Path, required: bool = False) -> dict:
    if key not in attrs:
        if required:
            raise ResultsError(f"{path}: damaged result: no {key!r} attribute")
        return {}
    try:
        value = json.loads(attrs[key])
    except (TypeError, ValueError):
        raise ResultsError(f"{path}: damaged result: attribute {key!r} is not JSON") from None
    if not isinstance(value, dict):
        raise ResultsError(
            f"{path}: damaged result: attribute {key!r} is a {type(value).__name__}, "
            "not a JSON object"
        )
    return value


def _check_attrs(attrs: dict, path: Path) -> None:
    if "schema_version" not in attrs:
        raise ResultsError(f"{path}: not an hpcpipe result (no schema_version)")
    v = attrs["schema_version"]
    v = v.item() if isinstance(v, np.generic) else v
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v:
        raise ResultsError(f"{path}: schema_version {v!r} is not a version (1..{SCHEMA_VERSION})")
    if v > SCHEMA_VERSION:
        raise ResultsError(
            f"{path}: schema {v} is newer than this hpcpipe reads ({SCHEMA_VERSION})"
        )
    status = attrs.get("status")
    if not isinstance(status, str) or status.strip() not in STATUSES:
        raise ResultsError(
            f"{path}: damaged result: status {status!r} is not one of {', '.join(STATUSES)}"
        )


def read_dataset(d, path: Path) -> np.ndarray:
    """A dataset's values; ResultsError naming it when a chunk fails its checksum.

    HDF5 verifies each chunk's Fletcher-32 checksum on read and fails the read when the
    stored bytes changed since they were written (a flipped bit on disk or in transit).
    """
    try:
        return d[()]
    except OSError as e:
        if d.fletcher32:
            raise ResultsError(
                f"{path}: damaged result: dataset {d.name} fails its Fletcher-32 checksum "
                f"({e}); restore the file from a copy or run it again"
            ) from None
        raise


def _check_state(state, path: Path) -> None:
    """Read the committed state (the one --resume would use): its checksums must hold.

    The other slot is not read: a kill during a save may have left it half written.
    """
    if COMMIT in state:
        read_dataset(state[COMMIT], path)
    slot = committed_slot(state)
    group = state[slot] if slot else state
    todo = [group]
    while todo:
        for name, obj in todo.pop().items():
            if isinstance(obj, h5py.Dataset):
                read_dataset(obj, path)
            elif isinstance(obj, h5py.Group) and not (group is state and name == BACKUP):
                todo.append(obj)


def has_checksums(f) -> bool:
    """True if every dataset of an open result file carries a Fletcher-32 checksum."""
    found = []
    f.visititems(lambda _, o: found.append(o.fletcher32) if isinstance(o, h5py.Dataset) else None)
    return all(found)


def _columns(group, names, path: Path, what: str, cut: bool) -> dict[str, np.ndarray]:
    """1-d datasets of one length (cut to the shortest when a kill fell between writes)."""
    out = {}
    for k in group:
        d = group[k]
        if not isinstance(d, h5py.Dataset) or d.ndim != 1:
            raise ResultsError(f"{path}: damaged result: {what}/{k} is not a 1-d dataset")
        out[k] = read_dataset(d, path)
        if (k in names or what == "iterations") and out[k].dtype.kind not in "biuf":
            raise ResultsError(
                f"{path}: damaged result: {what}/{k} holds {out[k].dtype} values, not numbers"
            )
    missing = [n for n in names if n not in out]
    if missing:
        raise ResultsError(f"{path}: damaged result: {what} lacks {', '.join(missing)}")
    lengths = {len(v) for v in out.values()}
    if len(lengths) > 1:
        if not cut:
            raise ResultsError(
                f"{path}: damaged result: the {what} datasets have different lengths "
                f"({min(lengths)}..{max(lengths)})"
            )
        n = min(lengths)
        out = {k: v[:n] for k, v in out.items()}
    return out


def cleared_injection(attrs: dict) -> dict:
    """{"inject_failure": ""} once an earlier resume cleared it (its resume_overrides)."""
    try:
        past = json.loads(attrs.get("resume_overrides", "[]"))
    except (TypeError, ValueError):
        return {}
    if isinstance(past, list) and any(
        isinstance(o, dict) and o.get("inject_failure") == "" for o in past
    ):
        return {"inject_failure": ""}
    return {}


def load(path: str | Path) -> Result:
    """Read one result file; ResultsError naming the file if it is not one, or is damaged."""
    path = Path(path)
    if not path.is_file():
        if path.is_dir():
            what = "is a folder, not a result file"
        elif path.exists():
            what = "is not a regular file (a FIFO, a socket or a device), not a result file"
        else:
            what = "no such file"
        raise ResultsError(f"{path}: {what}")
    _check_container(path)
    try:
        with _open(path) as f:
            attrs = {k: _text(v) for k, v in f.attrs.items()}
            _check_attrs(attrs, path)
            for g in ("iterations", "timeline", "stages"):
                if not isinstance(f.get(g), h5py.Group):
                    raise ResultsError(f"{path}: damaged result: no {g} group")
            cut = attrs["status"].strip() == "incomplete"  # a kill between two columns' writes
            its = _columns(f["iterations"], ("iteration",), path, "iterations", cut)
            tl = _columns(f["timeline"], TIMELINE_INT + TIMELINE_FLOAT, path, "timeline", cut)
            st = _columns(f["stages"], STAGE_FIELDS, path, "stages", False)
            order = _text(f["iterations"].attrs.get("columns", ""))
            order = tuple(c for c in order.split(",") if c in its)
            checksums = has_checksums(f)
            if isinstance(f.get("state"), h5py.Group):
                _check_state(f["state"], path)
    except ResultsError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as e:
        raise ResultsError(f"{path}: cannot be read as an hpcpipe result ({e})") from None
    cfg = _json_dict(attrs, "config", path, required=True)
    info = _json_dict(attrs, "info", path)
    for key in ("method", "problem", "figures"):
        _json_dict(attrs, key, path)
    its = {c: its[c] for c in order + tuple(sorted(set(its) - set(order)))}
    return Result(path, attrs, cfg, its, tl, st, info, order, checksums)


@dataclass
class SavedState:
    """The resumable state of an incomplete result (full vectors, on rank 0)."""

    arrays: dict[str, np.ndarray]  # the optimizer's arrays
    opt_scalars: dict[str, float]  # the optimizer's scalars
    scalars: np.ndarray  # next iteration, best f, pipeline time, first loss
    stage: np.ndarray  # (S, 4) busy, wait, idle, actions


def read_state(path: str | Path) -> SavedState:
    """The state of an incomplete result, for --resume, checked (schema 1: theta, prev, t).

    The state must be finite, its next iteration t a whole number with
    1 <= t <= planned iterations + 1, and the flushed rows must reach t − 1.
    """
    r = load(path)
    if r.status != "incomplete":
        raise ResultsError(f"{path}: status is {r.status!r}; only an incomplete run can be resumed")
    try:
        with _open(Path(path)) as f:
            g = f["state"]
            slot = committed_slot(g)  # a save cut short: the state before it
            g = g[slot] if slot else g
            p = Path(path)
            scalars, stage = read_dataset(g["scalars"], p), read_dataset(g["stage"], p)
            if "optimizer" in g:
                arrays = {k: read_dataset(g["optimizer"][k], p) for k in g["optimizer"]}
                names = json.loads(_text(g["optimizer_scalars"].attrs["names"]))
                opt = dict(zip(names, read_dataset(g["optimizer_scalars"], p).tolist()))
            else:  # schema 1: θ_t, θ_{t−1}; the iteration t is the next one
                arrays = {"theta": g["theta"][()], "prev": g["prev"][()]}
                opt = {"t": float(scalars[0])}
    except ResultsError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path}: has no resumable state ({e})") from None

    def bad(why: str) -> ResultsError:
        return ResultsError(f"{path}: damaged resume state: {why}")

    shapes = {v.shape for v in arrays.values()}
    if "theta" not in arrays or len(shapes) != 1 or arrays["theta"].ndim != 1:
        raise bad("the optimizer's arrays (theta first) are missing or have different shapes")
    if scalars.shape != (4,):
        raise bad("scalars have the wrong shape")
    if stage.ndim != 2 or stage.shape[1] != 4:
        raise bad("the per-stage totals have the wrong shape")
    for name, v in arrays.items():
        if not np.all(np.isfinite(v)):
            raise bad(f"{name} holds NaN or infinite values")
    if not all(math.isfinite(v) for v in opt.values()):
        raise bad("an optimizer scalar is NaN or infinite")
    t = float(scalars[0])
    planned = _json_dict(r.attrs, "method", Path(path)).get("iterations")
    top = int(planned) + 1 if isinstance(planned, int) else math.inf
    rows = r.iterations["iteration"]
    last = int(rows[-1]) if len(rows) and math.isfinite(rows[-1]) else 0
    if not (math.isfinite(t) and t == int(t) and 1 <= t <= top):
        raise bad(f"next iteration {t!r} is not a whole number in 1..{top}")
    if last < t - 1:
        raise bad(f"next iteration {int(t)} but the flushed rows end at iteration {last}")
    return SavedState(arrays, opt, scalars, stage)


def load_dir(directory: str | Path, warn=None) -> list[Result]:
    """Every readable result under a directory; unreadable files are skipped with a warning."""
    out = []
    for p in sorted(Path(directory).rglob("*.h5")):
        try:
            out.append(load(p))
        except ResultsError as e:
            (warn or (lambda m: print(f"warning: skipping {m}", file=sys.stderr)))(str(e))
    return out
