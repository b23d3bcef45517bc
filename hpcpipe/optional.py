"""Optional packages and the extras of hpcpipe that install them.

A run needs numpy, mpi4py, h5py and scipy only. Three extras bring what some
commands use, and each such package is imported through :func:`need`, where it
is used and never at ``import hpcpipe``:

* ``plot``: matplotlib (``analyze``'s figures, ``plot``, ``simulate --png``);
* ``data``: pandas and pyarrow (``Result.frame()``, ``export --format parquet``);
* ``paper``: scikit-learn (the bundled 8x8 digits of the ``attack``,
  ``attack-targeted`` and ``fewshot`` problems).

A missing package raises :class:`MissingExtra`, whose message is one line that
names the extra to install (``... needs matplotlib: pip install "hpcpipe[plot]"``);
the command line prints it and exits with status 2, without a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

# extra -> the distributions it installs (pyproject.toml's optional-dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "plot": ("matplotlib",),
    "data": ("pandas", "pyarrow"),
    "paper": ("scikit-learn",),
}
# import name -> distribution name, where they differ
_DISTRIBUTION = {"sklearn": "scikit-learn"}


class MissingExtra(ImportError):
    """An optional package is not installed; the message names the extra that brings it."""


def install_hint(module: str, extra: str) -> str:
    """``<package>: pip install "hpcpipe[<extra>]"`` for the top-level package of ``module``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}: choose one of {', '.join(EXTRAS)}")
    top = module.partition(".")[0]
    return f'{_DISTRIBUTION.get(top, top)}: pip install "hpcpipe[{extra}]"'


def missing_message(module: str, extra: str, what: str = "") -> str:
    """The one-line message of a missing ``module``: ``<what> needs <package>: pip install ...``."""
    return f"{what or 'this'} needs {install_hint(module, extra)}"


def need(module: str, extra: str, what: str = "") -> ModuleType:
    """Import ``module`` (e.g. ``"matplotlib.pyplot"``), or raise MissingExtra naming ``extra``.

    Only the absence of the package itself is turned into MissingExtra: an
    installed package that fails to import raises its own error unchanged.
    ``what`` says what needs it (default "this").
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.partition(".")[0]
        if e.name is not None and e.name.partition(".")[0] != top:
            raise  # the package is there; something it imports is broken
        raise MissingExtra(missing_message(module, extra, what)) from None


def available(module: str) -> bool:
    """Whether the top-level package of ``module`` can be imported, without importing it."""
    top = module.partition(".")[0]
    if top in sys.modules:
        return sys.modules[top] is not None
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


__all__ = ["EXTRAS", "MissingExtra", "available", "install_hint", "missing_message", "need"]
