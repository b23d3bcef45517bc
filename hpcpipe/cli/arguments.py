"""Argument types that several commands share: a registry name and a rank count.

Only the standard library is imported here: building a parser must stay cheap.
"""

from __future__ import annotations

import argparse
import re
from typing import Any


def registry_argument(registry) -> dict[str, Any]:
    """argparse keywords for a name read from ``registry``: its names are the choices,
    ``package.module:attribute`` is accepted too, and a bad name gets the registry's message."""

    class Names:
        def __contains__(self, name: object) -> bool:
            return isinstance(name, str) and registry.check(name) is None

        def __iter__(self):
            return iter([n for n in registry.names() if ":" not in n])

    def name(text: str) -> str:
        err = registry.check(text)
        if err:
            raise argparse.ArgumentTypeError(err)
        return text

    names = "|".join(Names())
    return {
        "type": name,
        "choices": Names(),
        "metavar": f"{{{names}}}|module:attr",
    }


def schedule_argument() -> dict[str, Any]:
    """``registry_argument`` of the schedules (imports the schedule registry)."""
    from hpcpipe.pipeline.schedules import SCHEDULES

    return registry_argument(SCHEDULES)


def add_schedule_arguments(parser: argparse.ArgumentParser, dest: str) -> None:
    """A schedule (positional ``dest``) and its size: ``--stages`` S and ``--items`` n."""
    parser.add_argument(
        dest,
        help="the schedule (a registered name or package.module:builder)",
        **schedule_argument(),
    )
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages S (default 4)")
    parser.add_argument("--items", type=int, default=8, help="work items n per call (default 8)")


def ranks_option(text: str) -> int:
    """``--np``: a whole number of ranks >= 1 in ASCII digits (argparse exits 2 otherwise)."""
    if not re.fullmatch(r"\s*[0-9]{1,7}\s*", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the number of ranks must be a whole number >= 1"
        )
    return int(text)


def int_list(text: str) -> list[int]:
    """A comma-separated list of integers (``"64,256"`` -> [64, 256]; empty items skipped)."""
    return [int(x) for x in text.split(",") if x]
