"""The wait policies of a rank whose message is in flight (the ``wait`` setting).

``busy`` (MPI Wait: the library spins), ``yield`` (Test, then sched_yield),
``sleep`` (Test, then a short sleep) and ``auto`` (busy when ranks <= cores,
else yield); ``transport.Waiter`` implements them. The names live here, apart
from the transport, so that reading or checking a configuration does not
import mpi4py (which initialises MPI) in the launching process.
"""

from __future__ import annotations

WAIT_POLICIES = ("busy", "yield", "sleep", "auto")

__all__ = ["WAIT_POLICIES"]
