"""The sub-commands of ``hpcpipe``: one module each, registered here in ``--help`` order.

A command module ``hpcpipe/cli/commands/<name>.py`` defines::

    NAME = "calibrate"                  # the sub-command
    HELP = "one line for hpcpipe --help"
    def add_arguments(parser: argparse.ArgumentParser) -> None: ...  # its own options
    def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int: ...

and, where it needs them:

* ``DESCRIPTION``: the text at the top of its ``--help`` (default: none);
* ``PARSER``: more keywords for its ``argparse`` parser (``add_help``, ``allow_abbrev``);
* ``TAKES_EXTRA = True``: the words argparse does not know reach ``run`` as ``extra``
  (otherwise they are refused before ``run`` is called).

``run`` returns the exit status: 0 done, 2 bad input (one line on stderr, before
any work). ``argv`` is the whole command line after ``hpcpipe``, for a command that
launches itself again under ``mpiexec``. The module's top level imports only the
standard library and light ``hpcpipe.cli`` modules; numpy, h5py, mpi4py, scipy and
matplotlib are imported in ``run`` (or, for options that need a registry, in
``add_arguments``, which runs only when that command is used), so that
``hpcpipe --help`` stays fast.

A new command is its module plus one line in ``COMMANDS``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

COMMANDS: tuple[str, ...] = (
    "schedule",
    "run",
    "sweep",
    "analyze",
    "jobs",
    "validate",
    "demo",
    "simulate",
    "trace",
    "export",
    "plot",
    "bench",
    "calibrate",
    "info",
)

REQUIRED = ("NAME", "HELP", "add_arguments", "run")


def load(name: str) -> ModuleType:
    """The command module ``hpcpipe.cli.commands.<name>``, checked for the interface above."""
    module = importlib.import_module(f"{__name__}.{name}")
    missing = [a for a in REQUIRED if not hasattr(module, a)]
    if missing:
        raise TypeError(f"command module {module.__name__} lacks {', '.join(missing)}")
    return module


def modules() -> list[ModuleType]:
    """The registered command modules, in ``COMMANDS`` order (read when called)."""
    return [load(n) for n in COMMANDS]
