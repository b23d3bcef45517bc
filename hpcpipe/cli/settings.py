"""Command-line options generated from the one configuration schema (``RunConfig``).

Every configuration key becomes ``--key VALUE`` (``--t-forward`` and
``--t_forward`` alike), listed in its group with its type, default and
meaning. Values stay strings here: ``config.make_config`` coerces and checks
them, so a bad value gets the same message from the command line as from a
TOML file.
"""

from __future__ import annotations

import argparse
import dataclasses

from hpcpipe.run.config import GROUPS, REGISTRIES, RunConfig, choices, shown_default

TYPE_NAMES = {"int": "integer", "float": "number", "str": "string"}


def keys() -> list[dataclasses.Field]:
    """The configuration keys in schema order."""
    return list(dataclasses.fields(RunConfig))


def _type_name(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else f.type.__name__
    return TYPE_NAMES.get(t, t)


def key_help(f: dataclasses.Field) -> str:
    """One key's help line: meaning, allowed values, type and default."""
    meaning = f.metadata.get("help", "")
    options = choices(f.name)
    own = ", or package.module:attribute" if f.name in REGISTRIES else ""
    allowed = f"; one of: {', '.join(map(str, options))}{own}" if options else ""
    default = shown_default(f)
    return f"{meaning}{allowed} ({_type_name(f)}, default {default})"


def add_settings(parser: argparse.ArgumentParser) -> None:
    """One option per configuration key, in argument groups named as the README groups them."""
    groups = {g: parser.add_argument_group(f"settings: {g}") for g in GROUPS}
    for f in keys():
        names = [f"--{f.name.replace('_', '-')}"]
        if "_" in f.name:
            names.append(f"--{f.name}")
        groups[f.metadata.get("group", GROUPS[-1])].add_argument(
            *names,
            dest=f"setting_{f.name}",
            metavar=_type_name(f).upper(),
            default=argparse.SUPPRESS,
            help=key_help(f),
        )


def given(args: argparse.Namespace) -> list[str]:
    """``key=value`` items of the settings given on the command line, in schema order."""
    return [
        f"{f.name}={getattr(args, 'setting_' + f.name)}"
        for f in keys()
        if hasattr(args, "setting_" + f.name)
    ]


def overrides(extra: list[str]) -> list[str]:
    """``--key value`` / ``--key=value`` / ``key=value`` words into ``key=value`` items.

    The settings' own options are parsed by argparse; what is left here is an
    unknown ``--key``, which stops with the config error naming the closest key.
    """
    from hpcpipe.run.config import FIELDS, unknown_key

    out, i = [], 0
    while i < len(extra):
        w = extra[i]
        if w.startswith("--"):
            w = w[2:]
            if w.split("=", 1)[0].replace("-", "_") not in FIELDS:
                raise unknown_key(w.split("=", 1)[0])
            if "=" not in w:
                if i + 1 >= len(extra):
                    raise SystemExit(f"hpcpipe: option --{w} needs a value")
                w = f"{w}={extra[i + 1]}"
                i += 1
        out.append(w)
        i += 1
    return out


def items(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """Every setting of the command line as ``key=value``: the options, then the extra words."""
    return given(args) + overrides(extra)
