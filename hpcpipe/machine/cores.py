"""The cores this process may run on: its affinity mask, or every core where there is none.

The wait policy ``auto`` (busy while the ranks fit the cores), the profiles' and benchmark
records' ``cores`` and the load checks all use it.
"""

from __future__ import annotations

import os


def cores() -> int:
    """Cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` elsewhere)."""
    aff = getattr(os, "sched_getaffinity", None)
    return len(aff(0)) if aff else (os.cpu_count() or 1)
