"""Problems: what is minimised (layers per stage, loss head, variable,
projection, regulariser, metrics, known constants and settings checks).

``PROBLEMS`` maps names to ``ProblemEntry``: the built-in chains
(``chains``), the hard instances (``worstcase``, ``nonconvex``) and digits problems
(``digits``), any registered with ``register_problem``, and
``package.module:factory`` names imported on use.

A built-in name is registered with the module that defines it (``BUILTIN``) and
its module is imported when the name is first looked up: every name is listed
and offered at once, and a run imports its own problem's module only (each
rank of a job pays its imports at start-up).
"""

from __future__ import annotations

import importlib

from hpcpipe.problems.base import L2Regulariser, Problem, ProblemEntry, as_entry, no_check
from hpcpipe.registry import Registry

# name -> the module of hpcpipe.problems whose ENTRIES holds it, in the registry's order
BUILTIN = {
    "l1-chain": "chains",
    "max-chain": "chains",
    "quad-chain": "chains",
    "nesterov-chain": "worstcase",
    "pinball-chain": "worstcase",
    "tridiag-chain": "worstcase",
    "zero-chain": "nonconvex",
    "attack": "digits",
    "attack-targeted": "digits",
    "fewshot": "digits",
}


def _builtin(name: str, module: str):
    def load() -> ProblemEntry:
        return importlib.import_module(f"hpcpipe.problems.{module}").ENTRIES[name]

    return load


PROBLEMS: Registry[ProblemEntry] = Registry("problem", load=as_entry)
for _name, _module in BUILTIN.items():
    PROBLEMS.register_lazy(_name, _builtin(_name, _module))


def register_problem(name: str, factory=None, *, check=no_check, theory: bool = False):
    """Register ``factory(cfg, comm) -> Problem`` under ``name`` (a decorator without it).

    ``check(cfg)`` raises ConfigError for settings the problem cannot use;
    ``theory``: the problem knows L or β and R (``mode = "theory"``).
    """

    def add(f):
        entry = as_entry(f, name)
        if check is not no_check or theory:
            entry = ProblemEntry(entry.build, check, theory, entry.about)
        PROBLEMS.register(name, entry)
        return f

    return add if factory is None else add(factory)


__all__ = ["L2Regulariser", "PROBLEMS", "Problem", "ProblemEntry", "register_problem"]
