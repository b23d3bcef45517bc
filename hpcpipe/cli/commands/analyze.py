"""``hpcpipe analyze``: the scaling studies' report; its options belong to the report."""

from __future__ import annotations

import argparse

NAME = "analyze"
HELP = "scaling studies and report from result directories"
PARSER = {"add_help": False}  # --help and every option reach the report's own parser
TAKES_EXTRA = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None here: ``hpcpipe.studies.report`` parses its own (``hpcpipe analyze --help``)."""


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.studies.report import main as analyze

    return analyze(extra)
