"""``hpcpipe export``: a result's tables as CSV or Parquet files, its attributes as JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcpipe.cli.files import load_result

NAME = "export"
HELP = "a result's tables as CSV or Parquet files"
DESCRIPTION = (
    "Write a result's iterations, timeline and stages tables (columns in "
    "the order of docs/results.md) and its attributes (JSON), for tools outside Python."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result", help="HDF5 result file")
    parser.add_argument(
        "--format", choices=["csv", "parquet"], default="csv", help="csv (default) or parquet"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="PREFIX",
        help="write PREFIX-iterations.csv, ... (default: the result's path without .h5)",
    )


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.run.export import ExportError, export

    r = load_result(args.result)
    if r is None:
        return 2
    from hpcpipe.run.config import path_error

    prefix = args.output or str(Path(args.result).with_suffix(""))
    err = path_error("-o", prefix, write=True)
    if err:
        print(f"hpcpipe: {err}", file=sys.stderr)
        return 2
    try:
        paths = export(r, args.format, prefix)
    except ExportError as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(f"wrote {p}")
    return 0
