"""hpcpipe: an MPI benchmark suite for pipeline-parallel optimization.

Reference: Colin, Dos Santos, Scaman, "Theoretical Limits of Pipeline Parallel
Optimization and Application to Distributed Deep Learning", NeurIPS 2019
(arXiv 1910.05104).

Users' own parts are registered here (docs/extending.md): ``register_problem``
and ``register_optimizer``; or named ``package.module:attribute`` in a run's
settings.

``import hpcpipe`` is cheap: the registration functions are imported on first
use (PEP 562 module ``__getattr__``), so a process that only asks for the
version, or a rank that runs one problem, pays for what it uses only. scipy,
scikit-learn and matplotlib are imported where they are needed, never here.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first access)
_LAZY = {
    "RegistryError": "hpcpipe.registry",
    "register_optimizer": "hpcpipe.optim",
    "register_problem": "hpcpipe.problems",
    "register_schedule": "hpcpipe.pipeline.schedules",
}

__all__ = [
    "RegistryError",
    "__version__",
    "register_optimizer",
    "register_problem",
    "register_schedule",
]


def __getattr__(name: str):
    """Import ``name`` from its module on first access and keep it (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
