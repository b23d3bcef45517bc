"""Configuration errors, shared by the run settings and the parts that check their own.

A problem or an optimizer checks the settings it reads (``check(cfg)``) and
raises ConfigError naming the field, its value and the fix; the command line
turns it into a message and exit status 2 before any rank starts work.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that makes no sense; the message names the field and the fix."""


def need(cond: bool, field: str, value, allowed: str) -> None:
    """Raise ConfigError ``field = value is not allowed: allowed`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{field} = {value!r} is not allowed: {allowed}")
