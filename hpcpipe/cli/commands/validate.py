"""``hpcpipe validate``: check a configuration without running it."""

from __future__ import annotations

import argparse
import sys

from hpcpipe.cli.arguments import ranks_option

NAME = "validate"
HELP = "check a configuration without running it"
DESCRIPTION = (
    "Check a configuration (a TOML file, the --key VALUE options, or both) without running it."
)
PARSER = {"allow_abbrev": False}
TAKES_EXTRA = True  # an unknown --key is a config error naming the closest key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hpcpipe.cli.settings import add_settings

    parser.add_argument("config", nargs="?", help="TOML file (optional)")
    parser.add_argument("--np", type=ranks_option, default=0, help="check it fits this many ranks")
    add_settings(parser)


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.cli.settings import items
    from hpcpipe.run.config import ConfigError, load, validate

    try:
        cfg = load(args.config, items(args, extra), ranks=args.np or None)
        validate(cfg, args.np or None)
    except ConfigError as e:
        print(f"hpcpipe: config error: {e}", file=sys.stderr)
        return 2
    ranks = f" on {args.np} ranks" if args.np else ""
    print(
        f"ok: {cfg.problem}, depth {cfg.depth}, {cfg.optimizer} ({cfg.mode}), "
        f"schedule {cfg.schedule}{ranks}"
    )
    return 0
