"""Errors shared across hpcpipe: configuration errors, and unreadable result files.

A problem or an optimizer checks the settings it reads (``check(cfg)``) and
raises ConfigError naming the field, its value and the fix; the command line
turns it into a message and exit status 2 before any rank starts work.
ResultsError lives here, not beside the HDF5 code, so that a run without an
output file never imports h5py.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that makes no sense; the message names the field and the fix."""


def need(cond: bool, field: str, value, allowed: str) -> None:
    """Raise ConfigError ``field = value is not allowed: allowed`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{field} = {value!r} is not allowed: {allowed}")


class ResultsError(ValueError):
    """A file that is not a readable hpcpipe result."""


class InjectedFailure(RuntimeError):
    """The failure a run was asked to raise (``inject_failure``), to test recovery."""
