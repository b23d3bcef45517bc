"""The hpcpipe command line: the top-level parser and the dispatch to one module per command.

The commands are the modules registered in ``hpcpipe.cli.commands.COMMANDS``;
each owns its options (``add_arguments``) and its work (``run``). A command's
options are added only when that command is used, so that ``hpcpipe --help``
imports none of the numerical libraries.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from types import ModuleType

from hpcpipe import __version__
from hpcpipe.cli import commands
from hpcpipe.cli.launch import inside_mpi

DESCRIPTION = (
    "hpcpipe: pipeline-parallel optimization (GD, AGD, PPRS) over MPI ranks; "
    "each command has its own --help."
)
COMMAND = "HPCPIPE_COMMAND"


class CommandParser(argparse.ArgumentParser):
    """A sub-command's parser that adds its command's options on first use (``ready``)."""

    def __init__(self, *args, command: ModuleType | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.command = command
        self._pending = command is not None

    def ready(self) -> CommandParser:
        """Add the command's options now (once)."""
        if self._pending:
            self._pending = False
            self.command.add_arguments(self)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.ready()
        if args is not None and self.command is not None:
            self.refuse_unknown_options(list(args))
        return super().parse_known_args(args, namespace)

    def refuse_unknown_options(self, args: list[str]) -> None:
        """Exit 2 naming the first ``--option`` this command does not know, before argparse
        can take the option's value for a positional argument (``demo --typo 1``); commands
        that take extra words (settings) or have sub-commands check their own."""
        if getattr(self.command, "TAKES_EXTRA", False) or self._subparsers is not None:
            return
        known = self._option_string_actions
        for word in args:
            if word == "--":
                return
            if not word.startswith("--"):
                continue
            name = word.split("=", 1)[0]
            matches = [o for o in known if o.startswith(name)] if self.allow_abbrev else []
            if name not in known and len(matches) != 1:
                close = difflib.get_close_matches(name, [o for o in known if o[:2] == "--"], 1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.exit(2, f"{self.prog}: unknown option {name}{hint}; see {self.prog} --help\n")

    def format_help(self) -> str:
        self.ready()
        return super().format_help()

    def format_usage(self) -> str:
        self.ready()
        return super().format_usage()


def build_parser(lazy: bool = False) -> argparse.ArgumentParser:
    """The ``hpcpipe`` parser: one sub-parser per registered command, in registration order.

    With ``lazy`` a command's options are added only when it is parsed (``main``);
    otherwise every sub-parser is complete on return (for tests and documentation).
    """
    p = argparse.ArgumentParser(prog="hpcpipe", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"hpcpipe {__version__}")
    p.add_argument(
        "--debug",
        action="store_true",
        help="show Python tracebacks (for bug reports; same as HPCPIPE_DEBUG=1)",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for module in commands.modules():
        s = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", None),
            command=module,
            **getattr(module, "PARSER", {}),
        )
        if not lazy:
            s.ready()
    return p


def typed_command(argv: list[str]) -> str:
    """The command as the user typed it (``hpcpipe ...`` or ``python -m hpcpipe ...``)."""
    import shlex

    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "hpcpipe"
    words = ["hpcpipe"] if prog == "hpcpipe" else ["python", "-m", "hpcpipe"]
    return shlex.join([*words, *argv])


# the status of a command whose reader went away (``hpcpipe sweep --list F | head -1``):
# 128 + SIGPIPE, what the shell reports for git and for the coreutils in that case
BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command it names; its exit status.

    When the program reading the output exits first (a pipe into ``head``), the command
    stops quietly with status 141 (128 + SIGPIPE), as git does: no traceback, no message.
    """
    import os

    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        # Python ignores SIGPIPE, so the write fails instead; the pending output cannot be
        # written: point stdout at /dev/null so that the flush at exit is silent too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE


def _main(argv: list[str] | None) -> int:
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    if not inside_mpi():  # the relaunched ranks inherit it; results store it
        os.environ[COMMAND] = typed_command(argv)
    args, extra = build_parser(lazy=True).parse_known_args(argv)
    if args.debug:  # the ranks a command launches inherit it
        os.environ["HPCPIPE_DEBUG"] = "1"
    module = {m.NAME: m for m in commands.modules()}[args.command]
    if extra and not getattr(module, "TAKES_EXTRA", False):
        print(f"hpcpipe {args.command}: unrecognised arguments {' '.join(extra)}", file=sys.stderr)
        return 2
    from hpcpipe.cli.failures import debug, describe
    from hpcpipe.errors import ConfigError, ResultsError
    from hpcpipe.optional import MissingExtra

    try:
        return module.run(args, extra, argv)
    except BrokenPipeError:  # the reader of stdout went away: main() stops quietly
        raise
    except MissingExtra as e:  # one line naming the extra to install, no traceback
        print(f"hpcpipe {args.command}: {e}", file=sys.stderr)
        return 2
    except (OSError, ConfigError, ResultsError) as e:  # a user's input or the machine
        if debug():
            raise
        print(f"hpcpipe {args.command}: {describe(e)}", file=sys.stderr)
        return 2 if isinstance(e, (ConfigError, ResultsError)) else 1


if __name__ == "__main__":
    sys.exit(main())
