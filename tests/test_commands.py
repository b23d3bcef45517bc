"""The command line's layout: one module per command, registered in one tuple.

A command added to ``hpcpipe.cli.commands.COMMANDS`` is parsed, dispatched and listed
in ``hpcpipe --help`` with nothing else changed; each bench case has its own options;
``hpcpipe --help`` imports none of the numerical libraries; no CLI module is long.
"""

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hpcpipe.cli import commands
from hpcpipe.cli.commands.bench import CASES
from hpcpipe.cli.main import build_parser, main

CLI = Path(__file__).parent.parent / "hpcpipe" / "cli"


def _command_module(name: str, calls: list, **attrs) -> types.ModuleType:
    """A throwaway command: ``--times N`` and a positional word, recording its calls."""
    m = types.ModuleType(f"hpcpipe.cli.commands.{name}")
    m.NAME = name
    m.HELP = f"the {name} command of this test"

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("word")
        parser.add_argument("--times", type=int, default=1, help="repeat the word")

    def run(args, extra, argv) -> int:
        calls.append((args.word * args.times, extra, argv))
        return 7

    m.add_arguments, m.run = add_arguments, run
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


@pytest.fixture
def register(monkeypatch):
    """Register a command module as a new module plus one line in COMMANDS would."""

    def add(module: types.ModuleType) -> None:
        monkeypatch.setitem(sys.modules, module.__name__, module)
        short = module.__name__.rsplit(".", 1)[1]
        monkeypatch.setattr(commands, "COMMANDS", (*commands.COMMANDS, short))

    return add


def test_a_registered_module_is_dispatched_and_listed(register, capsys):
    calls = []
    register(_command_module("echo", calls))
    assert main(["echo", "ab", "--times", "3"]) == 7  # its run's status is the exit status
    assert calls == [("ababab", [], ["echo", "ab", "--times", "3"])]
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    top = capsys.readouterr().out
    assert "echo" in top and "the echo command of this test" in top
    with pytest.raises(SystemExit):
        main(["echo", "--help"])
    assert "repeat the word" in capsys.readouterr().out


def test_unknown_words_are_refused_unless_the_command_takes_them(register, capsys):
    calls = []
    register(_command_module("echo", calls))
    with pytest.raises(SystemExit) as e:
        main(["echo", "ab", "--loud"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "hpcpipe echo: unknown option --loud; see hpcpipe echo --help\n"
    )
    assert main(["echo", "ab", "cd"]) == 2  # a word that is no option
    assert capsys.readouterr().err == "hpcpipe echo: unrecognised arguments cd\n"
    assert calls == []  # refused before run
    register(_command_module("echo2", calls, TAKES_EXTRA=True))
    assert main(["echo2", "ab", "--loud"]) == 7
    assert calls == [("ab", ["--loud"], ["echo2", "ab", "--loud"])]


def test_a_module_without_the_interface_is_named(register):
    broken = _command_module("broken", [])
    del broken.run
    register(broken)
    with pytest.raises(TypeError, match="hpcpipe.cli.commands.broken lacks run"):
        build_parser()


def test_commands_are_listed_in_registration_order():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [m.NAME for m in commands.modules()]
    assert len(set(sub.choices)) == len(commands.COMMANDS)


def _option_help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", commands.COMMANDS)
def test_the_lazy_parser_is_the_full_parser(name, capsys):
    """``main`` adds a command's options on first use: its help equals the eager parser's."""
    if name == "analyze":  # its --help belongs to the report's own parser
        return
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert _option_help(capsys, name) == sub.choices[name].format_help()


# every bench case's options, and only those
BENCH_OPTIONS = {
    "pipeline": {"--np", "--depth", "--samples", "--layer-time", "--schedules", "--repeats"}
    | {"--spin", "--wait", "--machine"},
    "dense": {"--np", "--width", "--mb", "--micro", "--repeats"},
    "transport": {"--np", "--max-bytes", "--min-bytes", "--iters", "--wait", "--repeats"},
    "simulate": {"--repeats"},
    "study": {"--depth", "--samples", "--repeats"},
    "peer": {"--np", "--width", "--mb", "--micro", "--repeats", "--port"},
}


@pytest.mark.parametrize("case", list(BENCH_OPTIONS))
def test_each_bench_case_lists_only_its_options(case, capsys):
    text = _option_help(capsys, "bench", case)
    shown = set(o for o in text.split() if o.startswith("--") and o.strip("[],").isascii())
    shown = {o.strip("[],") for o in shown} - {"--help"}
    assert shown == BENCH_OPTIONS[case], text
    assert set(CASES) == set(BENCH_OPTIONS)


def test_bench_transport_help_has_no_width_or_port(capsys):
    text = _option_help(capsys, "bench", "transport")
    assert "--width" not in text and "--port" not in text and "--max-bytes" in text


def test_an_option_of_another_case_is_refused_before_any_launch(monkeypatch, capsys):
    monkeypatch.setattr(
        "hpcpipe.cli.commands.bench.relaunch", lambda np_, argv: pytest.fail("launched")
    )
    assert main(["bench", "transport", "--width", "8"]) == 2
    assert "unrecognised arguments --width 8" in capsys.readouterr().err


def test_no_cli_module_is_over_300_lines():
    lengths = {
        p.relative_to(CLI).as_posix(): len(p.read_text().splitlines()) for p in CLI.rglob("*.py")
    }
    assert "commands/bench.py" in lengths and "main.py" in lengths
    assert {p: n for p, n in lengths.items() if n > 300} == {}, lengths


HEAVY = ("numpy", "scipy", "h5py", "mpi4py", "matplotlib", "sklearn")

# In a fresh interpreter: the heavy modules that `hpcpipe --help` imports beyond what
# `import hpcpipe` alone imports (the package's own start-up is checked on its own).
# With a folder argument, a command module there that imports matplotlib is registered.
PROBE = """
import json, sys
import hpcpipe
from hpcpipe.cli import commands
before = set(sys.modules)
if len(sys.argv) > 2:
    commands.__path__.append(sys.argv[2])
    commands.COMMANDS = (*commands.COMMANDS, "planted")
from hpcpipe.cli.main import main
try:
    main(["--help"])
except SystemExit:
    pass
heavy = sys.argv[1].split(",")
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in heavy)))
"""

PLANTED = """
import matplotlib

NAME = HELP = "planted"
def add_arguments(parser): pass
def run(args, extra, argv): return 0
"""


def _heavy_imports(*folder: str) -> list[str]:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(HEAVY), *folder],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_top_level_help_imports_no_numerical_library(tmp_path):
    assert _heavy_imports() == []
    (tmp_path / "planted.py").write_text(PLANTED)
    assert "matplotlib" in _heavy_imports(str(tmp_path))  # the probe sees a command that would


def test_the_documented_command_runs_as_written(register, capsys):
    """docs/extending.md's example command, registered as the page says, runs."""
    doc = (Path(__file__).parent.parent / "docs" / "extending.md").read_text()
    code = doc.split("```python\n# hpcpipe/cli/commands/bubble.py\n", 1)[1].split("```", 1)[0]
    module = types.ModuleType("hpcpipe.cli.commands.bubble")
    exec(compile(code, "bubble.py", "exec"), module.__dict__)
    register(module)
    assert main(["bubble", "--stages", "8", "--items", "3"]) == 0
    out = capsys.readouterr().out
    assert "bubble fraction 0.7000" in out and "= 0.7000" in out  # 7 / 10, both ways
    assert main(["bubble", "--stages", "0"]) == 2
    assert "--stages 0 --items 8: both must be >= 1" in capsys.readouterr().err
