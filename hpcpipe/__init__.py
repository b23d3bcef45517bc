"""hpcpipe: an MPI benchmark suite for pipeline-parallel optimization.

Reference: Colin, Dos Santos, Scaman, "Theoretical Limits of Pipeline Parallel
Optimization and Application to Distributed Deep Learning", NeurIPS 2019
(arXiv 1910.05104).

Users' own parts are registered here (docs/extending.md): ``register_problem``
and ``register_optimizer``; or named ``package.module:attribute`` in a run's
settings.
"""

__version__ = "0.1.0"

from hpcpipe.optim import register_optimizer  # noqa: E402
from hpcpipe.pipeline.schedules import register_schedule  # noqa: E402
from hpcpipe.problems import register_problem  # noqa: E402
from hpcpipe.registry import RegistryError  # noqa: E402

__all__ = [
    "RegistryError",
    "__version__",
    "register_optimizer",
    "register_problem",
    "register_schedule",
]
