"""The command line's help and settings: generated from the configuration schema."""

import argparse
import dataclasses
import re

import pytest

from hpcpipe.cli.commands.run import DEFAULT_OUTPUT
from hpcpipe.cli.commands.run import default_output as _default_output
from hpcpipe.cli.main import build_parser, main
from hpcpipe.run.config import GROUPS, RunConfig, shown_default


def subparser(name: str) -> argparse.ArgumentParser:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def help_text(*argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "validate"])
def test_help_lists_every_key_with_type_default_and_meaning(command, capsys):
    text = help_text(command, capsys=capsys)
    flat = " ".join(text.split())  # argparse wraps lines
    for f in dataclasses.fields(RunConfig):
        option = "--" + f.name.replace("_", "-")
        assert re.search(rf"{re.escape(option)}\b", text), option
        meaning = f.metadata["help"]
        assert meaning and " ".join(meaning.split()) in flat, f.name
        assert f"default {shown_default(f)})" in flat, f.name
    for group in GROUPS:  # one block per group, in the configuration reference's order
        assert f"settings: {group}:" in text
    assert text.index("settings: problem:") < text.index("settings: output:")


def test_every_key_has_a_meaning_and_a_known_group():
    for f in dataclasses.fields(RunConfig):
        assert f.metadata.get("help"), f.name
        assert f.metadata.get("group") in GROUPS, f.name


def test_every_option_of_schedule_and_simulate_has_help():
    for name in ("schedule", "simulate", "run", "validate", "trace", "plot"):
        for action in subparser(name)._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}"


def test_help_shows_no_raw_markup_and_names_the_real_default_file(capsys):
    top = help_text(capsys=capsys)
    assert "``" not in top and "hpcpipe" in top
    run = " ".join(help_text("run", capsys=capsys).split())
    assert "``" not in run
    assert f"default: write {DEFAULT_OUTPUT}" in run
    made = _default_output(RunConfig(problem="attack", optimizer="gd"))
    assert re.fullmatch(r"runs/attack-gd-\d{8}-\d{6}-\d+\.h5", made)
    assert DEFAULT_OUTPUT == "runs/<problem>-<optimizer>-<time>-<pid>.h5"


def test_validate_takes_overrides_without_a_config_file(capsys):
    assert main(["validate", "--depth", "8", "--np", "4", "--t_forward", "2"]) == 0
    assert "depth 8" in capsys.readouterr().out
    assert main(["validate", "--problem=max-chain", "--time-budget", "30"]) == 0
    assert "max-chain" in capsys.readouterr().out


def test_bad_or_unknown_options_are_config_errors(capsys):
    assert main(["validate", "--depth", "8", "--np", "16"]) == 2
    assert "number of ranks (16)" in capsys.readouterr().err
    assert main(["validate", "--dpeth", "8"]) == 2
    assert "did you mean 'depth'" in capsys.readouterr().err
    assert main(["validate", "--lr", "fast"]) == 2
    assert "lr: expected a number" in capsys.readouterr().err


def test_options_override_the_file(tmp_path, capsys):
    f = tmp_path / "run.toml"
    f.write_text('problem = "quad-chain"\ndepth = 3\n')
    assert main(["validate", str(f), "--depth", "5"]) == 0
    assert "quad-chain, depth 5" in capsys.readouterr().out
