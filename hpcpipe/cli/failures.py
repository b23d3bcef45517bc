"""How a failure reaches the user: one line naming what failed and the fix, no traceback.

A user's error (a setting, a file, a path) and an environmental fault (a full disk, a
folder that cannot be written, a peer that stopped answering) are reported as one line.
The traceback is for bug reports: ``HPCPIPE_DEBUG=1`` (or ``hpcpipe --debug``, which sets
it for the ranks too) shows it.
"""

from __future__ import annotations

import errno
import os

DEBUG = "HPCPIPE_DEBUG"

# what to do about an operating-system error, by errno
_FIX = {
    errno.ENOSPC: "free space or choose another output",
    errno.EDQUOT: "free space within your quota or choose another output",
    errno.EACCES: "choose a path you may write",
    errno.EPERM: "choose a path you may write",
    errno.EROFS: "choose a path on a writable file system",
    errno.ENOENT: "check the path, or create its folder first",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "give a file name, not a folder",
    errno.EEXIST: "choose another path (nothing is overwritten)",
}


def debug() -> bool:
    """Whether tracebacks are shown (``HPCPIPE_DEBUG`` set to anything but '' or '0')."""
    return os.environ.get(DEBUG, "") not in ("", "0")


def describe(e: BaseException) -> str:
    """One line for ``e``: an OSError names its file, the error and the fix; the project's
    own errors carry their message; anything else is named as a probable bug."""
    from hpcpipe.errors import ConfigError, InjectedFailure, ResultsError

    if isinstance(e, OSError) and e.strerror:
        where = e.filename if e.filename is not None else "a file"
        fix = _FIX.get(e.errno or 0)
        return f"{where}: {e.strerror}" + (f" ({fix})" if fix else "")
    if isinstance(e, (ConfigError, ResultsError, InjectedFailure)):
        return str(e)
    if type(e).__name__ == "WatchdogTimeout":  # a peer stopped answering: its message says who
        return str(e)
    return (
        f"{type(e).__name__}: {e} (an internal error: rerun with {DEBUG}=1 for the "
        "traceback to report it)"
    )
