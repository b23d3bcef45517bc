"""Output files written whole or not at all: a temporary file in the same folder, renamed.

Every file a command writes besides a run's result (a trace, an export's tables, a
plot, analyze's report and figures, a sweep's grid, a machine profile) goes through
``write``: the content goes to ``.<name>.<pid>.tmp<suffix>`` next to the target (same
file system, so ``os.replace`` is atomic, POSIX rename(2)), is flushed to disk, and only
then takes the target's name. A full disk (ENOSPC), a quota (EDQUOT) or any other write
error leaves no partial file that looks complete: the temporary file is removed, an
existing target keeps its old content, and the OSError names the target.

Fault injection (tests, no root): ``HPCPIPE_INJECT_DISK_FULL`` holds comma-separated
``fnmatch`` patterns of file names (``*.json``, ``report.md``, ``*``); a write whose
target's name matches fails with ENOSPC after its content went to the temporary file,
the moment a real full disk would show. ``edquot:`` before a pattern gives EDQUOT.
"""

from __future__ import annotations

import errno
import fnmatch
import os
from collections.abc import Callable
from pathlib import Path

INJECT = "HPCPIPE_INJECT_DISK_FULL"


def injected(path: str | Path) -> int | None:
    """The errno (ENOSPC or EDQUOT) an injected full disk gives a write of ``path``, or None."""
    spec = os.environ.get(INJECT, "")
    name = Path(path).name
    for pattern in filter(None, (s.strip() for s in spec.split(","))):
        code = errno.ENOSPC
        if pattern.startswith("edquot:"):
            code, pattern = errno.EDQUOT, pattern[len("edquot:") :]
        if fnmatch.fnmatch(name, pattern):
            return code
    return None


def check_injected(path: str | Path) -> None:
    """OSError naming ``path`` if an injected full disk covers it (``INJECT``)."""
    code = injected(path)
    if code is not None:
        raise OSError(code, f"{os.strerror(code)} (injected: {INJECT})", str(path))


def temporary(path: str | Path) -> Path:
    """The temporary name of ``path``: hidden, same folder, same suffix (for writers that
    choose a format by suffix, as matplotlib does)."""
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}.tmp{p.suffix}")


def write(path: str | Path, fill: Callable[[Path], object]) -> Path:
    """``fill(tmp)`` writes the content to a temporary path; it then replaces ``path``.

    On any failure the temporary file is removed and ``path`` is left as it was; an
    OSError is raised again naming ``path`` (the file the user asked for).
    """
    path = Path(path)
    tmp = temporary(path)
    try:
        fill(tmp)
        check_injected(path)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # a full disk that delays block allocation shows here
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        if e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        _remove(tmp)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """``Path.write_text`` that leaves the whole text or nothing (``write``)."""
    return write(path, lambda tmp: tmp.write_text(text))


def _remove(tmp: Path) -> None:
    try:
        tmp.unlink()
    except OSError:
        pass
