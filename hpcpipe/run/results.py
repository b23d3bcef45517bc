"""HDF5 results: one self-describing file per run, readable while it grows.

Written by rank 0 only, in SWMR mode (single writer, multiple readers), and
flushed every few iterations, so a job killed at any point (SIGKILL
included) leaves a file that opens with its flushed iterations and the
status ``incomplete``. Schema (version 1; see docs/results.md):

    /                      attrs: schema_version, status, config (JSON), config.<key>,
                           method (JSON), problem (JSON), versions, command, n_ranks,
                           hosts (JSON), start_time, end_time, clock
    /iterations/<column>   float64 (N,), one dataset per column of runner.COLUMNS
    /timeline/<field>      (E,) per recorded action: iteration, rank, stage, kind
                           (0 = F, 1 = B), item (int64); wait, start, end (float64,
                           seconds on the run's clock; wait..start is the receive wait)
    /stages/<field>        (S,) per stage over the recorded iterations: busy, wait,
                           idle (float64 seconds), actions (int64)

Plain numbers and strings only (no pickles): h5dump, h5py and pandas read it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

SCHEMA_VERSION = 1
STATUSES = ("complete", "incomplete", "diverged", "failed")
TIMELINE_INT = ("iteration", "rank", "stage", "kind", "item")
TIMELINE_FLOAT = ("wait", "start", "end")
STAGE_FIELDS = ("busy", "wait", "idle", "actions")


class ResultsError(ValueError):
    """A file that is not a readable hpcpipe result."""


def versions() -> dict:
    import mpi4py
    from mpi4py import MPI

    from hpcpipe import __version__

    return {
        "hpcpipe": __version__,
        "numpy": np.__version__,
        "mpi4py": mpi4py.__version__,
        "h5py": h5py.__version__,
        "hdf5": h5py.version.hdf5_version,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
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
    return {k: os.environ[k] for k in keys if k in os.environ}


class Writer:
    """Rank 0's writer of one result file."""

    def __init__(
        self,
        path: str | Path,
        attrs: dict,
        columns: tuple[str, ...],
        n_stages: int,
        overwrite: bool = False,
        state_size: int = 0,
    ):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists: results are never overwritten")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = h5py.File(self.path, "w", libver="latest")
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
            it.create_dataset(c, shape=(0,), maxshape=(None,), chunks=(1024,), dtype="f8")
        tl = self.f.create_group("timeline")
        for c in TIMELINE_INT:
            tl.create_dataset(c, shape=(0,), maxshape=(None,), chunks=(4096,), dtype="i8")
        for c in TIMELINE_FLOAT:
            tl.create_dataset(c, shape=(0,), maxshape=(None,), chunks=(4096,), dtype="f8")
        st = self.f.create_group("stages")
        for c in STAGE_FIELDS:
            st.create_dataset(c, data=np.zeros(n_stages, dtype="i8" if c == "actions" else "f8"))
        rs = self.f.create_group("state")
        rs.attrs["about"] = (
            "optimizer state at the last flush, for --resume: theta_t, "
            "theta_{t-1}, scalars = [next iteration, best f, pipeline time, "
            "first loss], per-stage totals [busy, wait, idle, actions]"
        )
        rs.create_dataset("theta", data=np.zeros(state_size))
        rs.create_dataset("prev", data=np.zeros(state_size))
        rs.create_dataset("scalars", data=np.array([1.0, np.inf, 0.0, np.nan]))
        rs.create_dataset("stage", data=np.zeros((n_stages, 4)))
        self.f.swmr_mode = True
        self.f.flush()

    @classmethod
    def reopen(cls, path: str | Path, last_iteration: int, columns: tuple[str, ...]) -> Writer:
        """Continue an incomplete file: drop rows/events after ``last_iteration``."""
        self = cls.__new__(cls)
        self.path, self.columns = Path(path), columns
        self.f = h5py.File(self.path, "r+", libver="latest")
        self.f.attrs["status"] = "incomplete"
        self.f.attrs["resumed"] = int(self.f.attrs.get("resumed", 0)) + 1
        n = int(
            np.searchsorted(self.f["iterations"]["iteration"][()], last_iteration, side="right")
        )
        for c in columns:
            self.f["iterations"][c].resize((n,))
        keep = int((self.f["timeline"]["iteration"][()] <= last_iteration).sum())
        for c in TIMELINE_INT + TIMELINE_FLOAT:
            self.f["timeline"][c].resize((keep,))
        self.f.swmr_mode = True
        self.f.flush()
        return self

    def save_state(self, theta, prev, scalars, stage) -> None:
        st = self.f["state"]
        st["theta"][...] = theta
        st["prev"][...] = prev
        st["scalars"][...] = np.asarray(scalars, dtype=float)
        st["stage"][...] = stage

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

        The reopen in read-write mode retries for a few seconds: a reader that
        happens to have the file open (another process checking a sweep's
        state) must not turn a finished run into a failure.
        """
        if status not in STATUSES:
            raise ValueError(f"status {status!r}")
        self.f.flush()
        self.f.close()
        for attempt in range(100):
            try:
                f = h5py.File(self.path, "r+")
                break
            except BlockingIOError:
                if attempt == 99:
                    raise
                time.sleep(0.1)
        with f:
            f.attrs["status"] = status
            f.attrs["end_time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            for k, v in (extra or {}).items():
                f.attrs[k] = v


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

    @property
    def status(self) -> str:
        return str(self.attrs["status"]).strip()

    def frame(self, what: str = "iterations"):
        """The iterations, timeline or stages as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(getattr(self, what))


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_container(path: Path) -> None:
    """Cheap checks before HDF5 sees the file: signature, and size against the superblock.

    A truncated file must fail fast (an SWMR reader otherwise retries its
    metadata reads for a long time). Superblock versions 2 and 3 store the
    end-of-file address at byte 28 (after signature, version, sizes, flags,
    base and extension addresses).
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(48)
    if not head.startswith(HDF5_SIGNATURE):
        raise ResultsError(f"{path}: not an HDF5 file (no HDF5 signature)")
    if len(head) >= 36 and head[8] in (2, 3) and head[9] == 8:
        eof = int.from_bytes(head[28:36], "little")
        if size < eof:
            raise ResultsError(f"{path}: truncated ({size} bytes, its superblock says {eof})")


def _open(path: Path):
    """Open a closed file normally; one still held (or left) by a writer in SWMR mode.

    Readers take no file lock (``locking=False``), so they never block the
    writer of a run that is still going on.
    """
    try:
        return h5py.File(path, "r", locking=False)
    except OSError:
        return h5py.File(path, "r", libver="latest", swmr=True, locking=False)


def load(path: str | Path) -> Result:
    """Read one result file; ResultsError naming the file if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"{path}: no such file")
    _check_container(path)
    try:
        with _open(path) as f:
            attrs = {k: _text(v) for k, v in f.attrs.items()}
            if "schema_version" not in attrs or "iterations" not in f:
                raise ResultsError(f"{path}: not an hpcpipe result (no schema_version)")
            if int(attrs["schema_version"]) > SCHEMA_VERSION:
                raise ResultsError(
                    f"{path}: schema {attrs['schema_version']} is newer than "
                    f"this hpcpipe reads ({SCHEMA_VERSION})"
                )
            its = {k: f["iterations"][k][()] for k in f["iterations"]}
            tl = {k: f["timeline"][k][()] for k in f["timeline"]}
            st = {k: f["stages"][k][()] for k in f["stages"]}
    except ResultsError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as e:
        raise ResultsError(f"{path}: cannot be read as an hpcpipe result ({e})") from None
    n = min((len(v) for v in its.values()), default=0)  # a kill between two columns' writes
    its = {k: v[:n] for k, v in its.items()}
    cfg = json.loads(attrs.get("config", "{}"))
    info = json.loads(attrs.get("info", "{}")) if "info" in attrs else {}
    return Result(path, attrs, cfg, its, tl, st, info)


def read_state(path: str | Path):
    """(theta, prev, scalars, stage) of an incomplete result, for --resume."""
    r = load(path)
    if r.status != "incomplete":
        raise ResultsError(f"{path}: status is {r.status!r}; only an incomplete run can be resumed")
    try:
        with _open(Path(path)) as f:
            g = f["state"]
            return g["theta"][()], g["prev"][()], g["scalars"][()], g["stage"][()]
    except (OSError, KeyError, ValueError, RuntimeError) as e:
        raise ResultsError(f"{path}: has no resumable state ({e})") from None


def load_dir(directory: str | Path, warn=None) -> list[Result]:
    """Every readable result under a directory; unreadable files are skipped with a warning."""
    out = []
    for p in sorted(Path(directory).rglob("*.h5")):
        try:
            out.append(load(p))
        except ResultsError as e:
            (warn or (lambda m: print(f"warning: skipping {m}", file=sys.stderr)))(str(e))
    return out
