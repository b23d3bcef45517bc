"""The files commands read and write: output-path checks and loading a result.

Result files are never overwritten by accident: ``output_error`` refuses an
existing HDF5 file unless ``--force`` is given, and never lets a command write
the file it reads. Every check runs before any work starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def load_result(path: str):
    """The result at path, or None after printing why it cannot be read."""
    from hpcpipe.run.config import path_error
    from hpcpipe.run.results import NO_CHECKSUMS, ResultsError, load

    err = path_error("result", path, write=False)
    if err:
        print(f"hpcpipe: {err}", file=sys.stderr)
        return None
    try:
        r = load(path)
    except ResultsError as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return None
    if not r.checksums:
        print(f"hpcpipe: note: {path}: {NO_CHECKSUMS}", file=sys.stderr)
    return r


def output_error(path: str, inputs: tuple[str, ...] = (), force: bool = False) -> str | None:
    """Why ``-o path`` cannot be written, or None: result files are never overwritten.

    An existing HDF5 file (a result) is replaced only with ``--force``; the file a
    command reads is never its own output.
    """
    from hpcpipe.run.config import path_error
    from hpcpipe.run.superblock import SIGNATURE

    p = Path(path)
    if not path:
        return "-o: an empty path"
    err = path_error("-o", path, write=True)
    if err:
        return err
    for src in inputs:
        if p.exists() and Path(src).exists() and p.resolve() == Path(src).resolve():
            return f"-o {path} is the file this command reads: choose another output"
    if p.is_symlink() and not p.exists():
        return f"-o {path} is a dangling symbolic link"
    if p.is_dir():
        return f"-o {path} is a folder: give a file name"
    parent = p.parent
    if not parent.exists():
        return f"-o {path}: folder {str(parent)!r} does not exist (create it first)"
    if not parent.is_dir():
        return f"-o {path}: {str(parent)!r} is a file, not a folder"
    if p.exists():
        try:
            with open(p, "rb") as fh:
                is_h5 = fh.read(8) == SIGNATURE
        except OSError as e:
            return f"-o {path}: cannot be read ({e.strerror})"
        if is_h5 and not force:
            return f"-o {path} holds an HDF5 file (a result?): kept (--force replaces it)"
    return None


def recorded_iteration(r, wanted: int | None, source: str) -> int | str:
    """The iteration to draw (default the last recorded) or a message why it cannot be."""
    its = sorted(set(r.timeline["iteration"].tolist()))
    if not its:
        return f"{source} has no recorded timeline"
    if wanted is None:
        return int(its[-1])
    if wanted not in its:
        shown = ", ".join(map(str, its[:8])) + (f", ... {its[-1]}" if len(its) > 8 else "")
        return f"--iteration {wanted} was not recorded in {source}; recorded: {shown}"
    return wanted


def add_picture_arguments(parser: argparse.ArgumentParser, output: str, iteration: str) -> None:
    """The options ``trace`` and ``plot`` share: a result, ``-o``, ``--iteration``, ``--force``."""
    parser.add_argument("result", help="HDF5 result file")
    parser.add_argument("-o", "--output", required=True, help=output)
    parser.add_argument("--iteration", type=int, default=None, help=iteration)
    parser.add_argument("--force", action="store_true", help="replace an existing HDF5 file at -o")


def picture_source(args: argparse.Namespace, default_last: bool) -> tuple[Any, int | None] | int:
    """For ``trace`` and ``plot``: refuse a bad ``-o``, load the result, resolve
    ``--iteration`` (None: all of them, or the last recorded with ``default_last``).

    Returns (result, iteration) or an exit status after printing why.
    """
    err = output_error(args.output, (args.result,), args.force)
    if err:
        print(f"hpcpipe: {err}", file=sys.stderr)
        return 2
    r = load_result(args.result)
    if r is None:
        return 2
    if args.iteration is None and not default_last:
        return r, None
    it = recorded_iteration(r, args.iteration, args.result)
    if isinstance(it, str):
        print(f"hpcpipe: {it}", file=sys.stderr)
        return 2
    return r, it
