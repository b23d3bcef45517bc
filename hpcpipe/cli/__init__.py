"""The hpcpipe command line and its launcher helpers."""

from hpcpipe.cli.main import main

__all__ = ["main"]
