"""Problems: what is minimised (layers per stage, loss head, variable,
projection, regulariser, metrics, known constants and settings checks).

``PROBLEMS`` maps names to ``ProblemEntry``: the built-in chains
(``chains``), the hard instances (``worstcase``, ``nonconvex``) and digits problems
(``digits``), any registered with ``register_problem``, and
``package.module:factory`` names imported on use.
"""

from __future__ import annotations

from hpcpipe.problems import chains, digits, nonconvex, worstcase
from hpcpipe.problems.base import L2Regulariser, Problem, ProblemEntry, as_entry, no_check
from hpcpipe.registry import Registry

PROBLEMS: Registry[ProblemEntry] = Registry("problem", load=as_entry)
for _name, _entry in {
    **chains.ENTRIES,
    **worstcase.ENTRIES,
    **nonconvex.ENTRIES,
    **digits.ENTRIES,
}.items():
    PROBLEMS.register(_name, _entry)


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
