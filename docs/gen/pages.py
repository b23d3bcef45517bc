"""The generated pages of the documentation: read from the code, so that they cannot drift.

Each function returns Markdown. ``pages()`` maps a page's path under ``docs/`` to its text;
``hook.py`` hands them to MkDocs at build time, and ``tests/test_docs.py`` calls the same
functions without MkDocs.

* ``commands/<name>.md``: one page per sub-command of ``hpcpipe.cli.main.build_parser()``
  (only the top-level parser's sub-parsers are walked, and nested sub-parsers below them,
  so the pages follow the command modules wherever their options are defined);
* ``reference/configuration.md``: every field of ``hpcpipe.run.config.RunConfig`` with its
  group, type, default, allowed values and meaning (the field's ``help`` metadata);
* ``reference/sweep-file.md``: the sweep-file format from ``hpcpipe.studies.sweep``;
* ``reference/studies.md``: each study's docstring and the rows and figures of the
  ``hpcpipe analyze`` report kept in ``docs/records/report/``;
* ``reference/benchmarks.md``: the benchmark records kept in ``docs/records/bench/*.json``
  (written by ``hpcpipe.bench.common.write_record``).
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import importlib
import inspect
import json
import os
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
RECORDS = DOCS / "records"
REPORT = RECORDS / "report"
BENCH = RECORDS / "bench"

# A sub-command whose options are parsed by a parser of its own (the sub-parser is an
# empty shell that hands its arguments on): where that parser is built.
DELEGATED = {"analyze": "hpcpipe.studies.report:parser"}


def cell(text: object) -> str:
    """A Markdown table cell: one line, '|' escaped, HTML special characters escaped."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def code(text: object) -> str:
    """Inline code for a table cell ('|' cannot appear raw inside a cell)."""
    s = str(text)
    if "|" in s:
        return cell(s)
    fence = "``" if "`" in s else "`"
    return f"{fence}{s}{fence}"


# ---------------------------------------------------------------- commands


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """name -> (one-line help, parser) of a parser's sub-commands, in their order."""
    out: dict[str, tuple[str, argparse.ArgumentParser]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out[name] = (helps.get(name, ""), sub)
    return out


def _delegate(name: str, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser that really holds a command's options (see DELEGATED)."""
    if name in DELEGATED and not parser._actions:
        module, _, attr = DELEGATED[name].partition(":")
        return getattr(importlib.import_module(module), attr)()
    return parser


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return ""
    d = action.default
    if d is None or d is argparse.SUPPRESS:
        return ""
    return code(d if d != "" else '""')


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | choices | meaning |", "| --- | --- | --- | --- |"]
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or isinstance(
            a, (argparse._SubParsersAction, argparse._HelpAction)
        ):
            continue
        names = a.option_strings or [a.metavar or a.dest]
        choices = ", ".join(code(c) for c in a.choices) if a.choices else ""
        meaning = a.help or ""
        if "%(default)" in meaning:
            meaning = meaning % {"default": a.default}
        name = ", ".join(code(n) for n in names)
        rows.append(f"| {name} | {_default(a)} | {choices} | {cell(meaning)} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # the same wrapping wherever the page is built
    try:
        return parser.format_usage().strip()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def _command(path: list[str], summary: str, parser: argparse.ArgumentParser, depth: int):
    title = "#" * depth + " " + " ".join(["hpcpipe", *path])
    lines = [title, ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ".", ""]
    if parser.description and parser.description != summary:
        lines += [parser.description.strip(), ""]
    usage = "\n".join(  # without "usage: ", the continuation lines 7 columns less indented
        line[7:] if i and line.startswith(" " * 7) else line
        for i, line in enumerate(_usage(parser).replace("usage: ", "", 1).splitlines())
    )
    lines += ["```text", usage, "```", ""]
    lines += _options(parser) + [""]
    for name, (help_, sub) in _subparsers(parser).items():
        lines += _command([*path, name], help_, sub, min(depth + 1, 4))
    return lines


def commands() -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Every top-level sub-command: name -> (one-line help, the parser of its options)."""
    from hpcpipe.cli.main import build_parser

    return {
        name: (help_, _delegate(name, sub))
        for name, (help_, sub) in _subparsers(build_parser()).items()
    }


def command_pages() -> dict[str, str]:
    """``commands/<name>.md`` for every sub-command, and ``commands/index.md``."""
    pages = {}
    index = [
        "# Commands",
        "",
        "Generated from the command line's own parsers (`hpcpipe <command> --help` shows "
        "the same options).",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    for name, (help_, parser) in commands().items():
        pages[f"commands/{name}.md"] = "\n".join(_command([name], help_, parser, 1)) + "\n"
        index.append(f"| [`{name}`]({name}.md) | {cell(help_)} |")
    pages["commands/index.md"] = "\n".join(index) + "\n"
    return pages


# ---------------------------------------------------------------- configuration


def _type_name(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return {"str": "string", "int": "integer", "float": "number"}.get(t, t)


def configuration_page() -> str:
    """Every run setting, by group, from the ``RunConfig`` schema."""
    from hpcpipe.run.config import GROUPS, RunConfig, choices

    fields = dataclasses.fields(RunConfig)
    lines = [
        "# Configuration reference",
        "",
        "Every setting of a run, generated from the schema (`hpcpipe.run.config.RunConfig`: "
        "each field's default, type, group and meaning), which the command line's options, "
        "the TOML files and the checks read too. A setting is a TOML key (flat, or in a "
        "`[run]` table), a `--key VALUE` option of `hpcpipe run` and `hpcpipe validate` "
        "(`--time-budget` and `--time_budget` both work), and a key of a sweep's `[base]`, "
        "`[grid]` or `[[cases]]`. Names of registries (problem, optimizer, schedule, "
        "executor) also take a `package.module:attribute` of your own "
        "([extending](../extending.md)).",
        "",
        f"{len(fields)} settings in {len(GROUPS)} groups.",
        "",
    ]
    for group in GROUPS:
        lines += [
            f"## {group}",
            "",
            "| key | option | type | default | values | meaning |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for f in fields:
            if f.metadata["group"] != group:
                continue
            allowed = choices(f.name)
            values = ", ".join(code(c) for c in allowed) if allowed else ""
            default = code(f.default if f.default != "" else '""')
            if "shown" in f.metadata:  # a default that follows other settings
                default = cell(f.metadata["shown"])
            lines.append(
                f"| `{f.name}` | `--{f.name.replace('_', '-')}` | {_type_name(f)} | "
                f"{default} | {values} | {cell(f.metadata['help'])} |"
            )
        lines.append("")
    lines += _CONFIG_NOTES
    return "\n".join(lines) + "\n"


_CONFIG_NOTES = [
    "## Defaults that follow other settings",
    "",
    '`optimizer = "pprs"` in practical mode takes `samples = 10` and `gamma = 0.01` '
    "unless they are given (with `samples = 1` and `gamma = 0` PPRS's update is AGD's, bit "
    "for bit); theory mode plans both from `epsilon`. `depth` is 4, or the rank count when "
    "more ranks run on the mpi executor (`hpcpipe run --np 16` runs depth 16).",
    "",
    "## Checks",
    "",
    "Every setting is checked before any rank starts, and a bad one stops with exit status "
    "2 and one line naming the field (`depth = 2 is not allowed: depth must be >= the "
    "number of ranks (4)`, `unknown key 'sampels' (did you mean 'samples'?)`).",
    "",
    "Integers are ASCII digits within int64; numbers that overflow, non-ASCII digits, empty "
    "values and control characters are refused, as are keys beside a `[run]` table (they "
    "would be ignored), a `seed` outside 0..2⁶³−1, an `inject_failure` rank or iteration the "
    "run never reaches, and an `output` under a file or a dangling link. The memory a run "
    "needs (layers, stashed activations, the iteration table and timeline kept in memory; "
    "see `hpcpipe/run/resources.py`) is estimated first and a run that cannot fit is "
    "refused with the figure and the limit: the machine's available memory, or "
    "`HPCPIPE_MEMORY_LIMIT` (e.g. `64G`) for compute nodes that differ from the node that "
    "checks (`--depth 1000000` at d = 16: about 5.3 GiB).",
    "",
    "`hpcpipe validate --depth 8 --np 4` checks settings without a file; "
    "`hpcpipe run --help` lists the same keys with their defaults.",
]


# ---------------------------------------------------------------- sweep file


def sweep_page() -> str:
    """The sweep-file format: the module's docstring, its tables and keys, a shipped file."""
    from hpcpipe.studies import sweep

    doc = re.sub(r"``([^`]+)``", r"`\1`", inspect.getdoc(sweep) or "")
    example = DOCS.parent / "jobs" / "sweeps" / "smooth.toml"
    lines = [
        "# Sweep-file format",
        "",
        "From `hpcpipe.studies.sweep` (its docstring, its tables and keys):",
        "",
        doc,
        "",
        "## Tables",
        "",
        "| table | holds |",
        "| --- | --- |",
    ]
    for table, meaning in sweep.TABLES.items():
        lines.append(f"| `{table}` | {cell(meaning)} |")
    lines += ["", "## Keys of `[sweep]`", "", "| key | meaning |", "| --- | --- |"]
    for key, meaning in sweep.SWEEP_KEYS.items():
        lines.append(f"| `{key}` | {cell(meaning)} |")
    lines += [
        "",
        "`[base]`, `[grid]` and each `[[cases]]` table take any key of the "
        "[configuration reference](configuration.md); every point is checked like a run's "
        "settings before anything runs. A point's file name is its index and a label made "
        "of its case label and grid values, with every character other than letters, "
        "digits and `. + = -` replaced by `_`.",
        "",
        "The ranks of a point come from `[sweep] ranks` (or its depth), never from the "
        "command line: `hpcpipe sweep FILE --np P` sets the ranks of the one local launch "
        "(default: the largest point's), inside which each point runs on a sub-communicator "
        "of its own `ranks`. To run every point on 4 ranks, write `ranks = 4`. A launch "
        "with room for several of the largest point (P >= 2R for points of at most R ranks) "
        "runs P // R points side by side, each on its own group of R ranks, with the points "
        "dealt out to the groups in turn: `--np 2` runs a sweep of one-rank points on two "
        "cores. Every point's file is the one a launch of R ranks writes (wall-clock "
        "columns aside); runs that measure wall-clock time want a launch of R ranks.",
        "",
    ]
    if example.is_file():
        lines += [
            "## A shipped sweep file",
            "",
            f"`jobs/sweeps/{example.name}`:",
            "",
            "```toml",
            example.read_text().rstrip(),
            "```",
            "",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------- studies


def _report_sections(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The verdict rows (header lines excluded) and each study's section lines."""
    rows, sections, current = [], {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif line.startswith("| ") and not line.startswith(("| study", "| ---")):
            rows.append(line)
    return rows, sections


def studies_page(report: Path = REPORT) -> str:
    """Each study: its docstring (regime, claims, predictions), then the verdict rows and
    figures of the stored ``hpcpipe analyze`` report, when it holds the study."""
    from hpcpipe.studies.report import STUDIES

    path = report / "report.md"
    text = path.read_text() if path.is_file() else ""
    rows, sections = _report_sections(text)
    meta = (report / "record.json").read_text() if (report / "record.json").is_file() else ""
    lines = [
        "# The studies",
        "",
        "Each study holds a claim of the paper against measurements, in the regime where "
        "the theory predicts it shows, and prints the prediction beside the measurement. "
        "*Bound*, *consistency* and *design* rows fail the report (exit status 1); *claim* "
        "rows are reported as reproduced or not. The text of each study is its module's "
        "docstring; the rows and figures come from the `hpcpipe analyze` report kept in "
        "`docs/records/report/`.",
        "",
    ]
    if meta:
        rec = json.loads(meta)
        lines += [
            f"Stored report: {cell(rec.get('date', ''))}, `{cell(rec.get('command', ''))}`, "
            f"{cell(rec.get('machine', ''))}. {cell(rec.get('note', ''))}",
            "",
        ]
        if rec.get("timings"):
            lines += ["| study | wall (s) | CPU (s) | load at start, end |", "|---|---|---|---|"]
            for t in rec["timings"]:
                load = f"{t['load_start']:.1f}, {t['load_end']:.1f}" if "load_start" in t else ""
                lines.append(f"| {t['study']} | {t['wall_s']:.0f} | {t['cpu_s']:.0f} | {load} |")
            lines.append("")
    else:
        lines += ["No report is stored yet: every section below shows the docstring only.", ""]
    for name, mod in STUDIES.items():
        lines += [f"## {name}", ""]
        lines += [_demote(inspect.getdoc(mod) or ""), ""]
        mine = [r for r in rows if r.split("|")[1].strip() == name]
        section = sections.get(name)
        if mine:
            lines += [
                "### Verdicts (stored report)",
                "",
                "| study | claim | bound | measured | verdict | executor | sources |",
                "| --- | --- | --- | --- | --- | --- | --- |",
                *mine,
                "",
            ]
        if section:
            lines += ["### Notes, tables and figures (stored report)", ""]
            lines += [_relink(line) for line in section]
            lines.append("")
        if not mine and not section:
            lines += [
                "*Not in the stored report:* run the study (`python analysis/reproduce.py "
                f"--only {name}`) and `hpcpipe analyze results -o report --study {name}`.",
                "",
            ]
    return "\n".join(lines)


def _demote(doc: str) -> str:
    """A docstring as Markdown: its reST double backticks as code, its first line bold."""
    doc = re.sub(r"``([^`]+)``", r"`\1`", doc)
    first, _, rest = doc.partition("\n")
    return f"**{first.strip()}**\n{rest}"


def _relink(line: str) -> str:
    """A report's figure (``![name](fig.png)``), linked from the page to the stored copy;
    the report's own level-3 titles one level down."""
    line = re.sub(r"!\[([^\]]*)\]\(([^)/]+)\)", r"![\1](../records/report/\2)", line)
    return "#" + line if line.startswith("### ") else line


# ---------------------------------------------------------------- benchmarks


def bench_records(folder: Path = BENCH) -> list[dict]:
    """The stored benchmark records, newest first."""
    recs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    recs = sorted(recs, key=lambda r: (r["date"], r["case"]), reverse=True)
    seen: dict[str, int] = {}
    for r in recs:  # records of one case within one second: -2, -3, ... on the anchor
        base = re.sub(r"[^a-z0-9]+", "-", f"{r['case']}-{r['date']}".lower()).strip("-")
        seen[base] = seen.get(base, 0) + 1
        r["anchor"] = base if seen[base] == 1 else f"{base}-{seen[base]}"
    return recs


def benchmarks_page(folder: Path = BENCH) -> str:
    """One section per stored record: date, command, machine, versions, load, figures."""
    recs = bench_records(folder)
    lines = [
        "# Benchmark records",
        "",
        "Every `hpcpipe bench` case writes a JSON record (`hpcpipe.bench.common.write_record`"
        ": the command, the machine, the versions, the load average at its start and end, "
        "and its figures with their units). This page is generated from the records kept "
        "in `docs/records/bench/`; a figure is only comparable with figures of the same "
        "record, or of records taken on the same machine at a similar load. What each case "
        "measures: [benchmarks explained](../explanation/benchmarks.md).",
        "",
        "| date (UTC) | case | machine | load (1 min) start → end | sanity |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in recs:
        m = r["machine"]
        lines.append(
            f"| {cell(r['date'])} | [`{r['case']}`](#{_anchor(r)}) | {cell(m['host'])}, "
            f"{m['cores']} cores | {r['load_start'][0]:.2f} → {r['load_end'][0]:.2f} | "
            f"{'ok' if r['sane'] else 'FAILED'} |"
        )
    lines.append("")
    lines += goals_table(recs)
    for r in recs:
        m, v = r["machine"], r["versions"]
        lines += [
            f"## {r['case']}, {r['date']} {{#{_anchor(r)}}}",
            "",
            f"- command: `{r['command']}`",
            f"- machine: {cell(m['host'])} ({cell(m['arch'])}, {m['cores']} cores), "
            f"{cell(r.get('ranks', ''))}",
            "- load average (1, 5, 15 min): "
            + ", ".join(f"{x:.2f}" for x in r["load_start"])
            + " at the start; "
            + ", ".join(f"{x:.2f}" for x in r["load_end"])
            + " at the end",
            "- versions: " + ", ".join(f"{k} {cell(x)}" for k, x in v.items()),
        ]
        if r.get("what"):
            lines.append(f"- measured: {cell(r['what'])}")
        lines += ["", "| " + " | ".join(cell(h) for h in r["headings"]) + " |"]
        lines.append("|" + " --- |" * len(r["headings"]))
        for row in r["rows"]:
            lines.append("| " + " | ".join(cell(_num(x)) for x in row) + " |")
        lines.append("")
    if not recs:
        lines += ["No record is stored yet.", ""]
    return "\n".join(lines)


def goals_table(recs: list[dict]) -> list[str]:
    """The records that carry a goal (``write_record(goal=...)``), newest first: the
    goal's figure in each row of the record and whether every row meets it."""
    from hpcpipe.bench.common import goal_text, met

    held = [r for r in recs if r.get("goal")]
    if not held:
        return []
    lines = [
        "Goals: the figure a case is held to, in each row of its records (a goal is met "
        "when every row meets it).",
        "",
        "| date (UTC) | case | load (1 min) at start | goal | figure per row | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in held:
        goal = r["goal"]
        col = r["headings"].index(goal["figure"])
        values = [row[col] for row in r["rows"]]
        ok = all(isinstance(v, (int, float)) and met(goal, v) for v in values)
        lines.append(
            f"| {cell(r['date'])} | [`{r['case']}`](#{_anchor(r)}) | "
            f"{r['load_start'][0]:.2f} | {code(goal_text(goal))} | "
            f"{', '.join(_num(v) for v in values)} | {'yes' if ok else '**no**'} |"
        )
    return [*lines, ""]


def _anchor(r: dict) -> str:
    """The record's section id on the page (unique: ``bench_records``)."""
    return r["anchor"]


def _num(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


# ---------------------------------------------------------------- all


def pages() -> dict[str, str]:
    """Every generated page: path under docs/ -> Markdown."""
    out = command_pages()
    out["reference/configuration.md"] = configuration_page()
    out["reference/sweep-file.md"] = sweep_page()
    out["reference/studies.md"] = studies_page()
    out["reference/benchmarks.md"] = benchmarks_page()
    return out


README = DOCS.parent / "README.md"
README_START = "<!-- studies table: generated by python docs/gen/pages.py --readme; do not edit -->"
README_END = "<!-- end of the generated studies table -->"


README_MISSES = 3  # claims named per study in the README's table (all: the studies page)


def readme_table(report: Path = REPORT) -> str:
    """The README's studies table, from the stored report: one row per study with its
    verdict rows counted by verdict, and the claims not reproduced or failed named
    (consistency checks are left out: they hold by construction)."""
    from hpcpipe.studies.report import STUDIES

    path = report / "report.md"
    rows, _ = _report_sections(path.read_text() if path.is_file() else "")
    meta = report / "record.json"
    rec = json.loads(meta.read_text()) if meta.is_file() else {}
    where = re.match(r"machine (\S+) \(([^,]+), (\d+) cores", str(rec.get("machine", "")))
    on = f" on {where[1]} ({where[2]}, {where[3]} cores)" if where else ""
    times = {t["study"]: t for t in rec.get("timings", [])}
    took = ""
    if "all" in times:
        a = times["all"]
        m, sec = divmod(round(a["wall_s"]), 60)
        # a record with a "runs" row times the whole command; an older one, the runs only
        what = (
            "`python analysis/reproduce.py`"
            if "runs" in times
            else ("the runs of `python analysis/reproduce.py` (the analysis not included)")
        )
        took = (
            f"; {what} took {m} min {sec} s wall and "
            f"{a['cpu_s']:.0f} s of CPU, {a.get('jobs', 1)} model-clock jobs at a time"
        )
    lines = [
        f"Verdicts of the stored report ({rec.get('date', 'none stored')}{on}{took}; every "
        "row, its prediction and its measurement: the site's studies page):",
        "",
        "| study | verdict rows | not reproduced or failed | wall, CPU |",
        "| --- | --- | --- | --- |",
    ]
    for name in STUDIES:
        t = times.get(name)
        spent = f"{t['wall_s']:.0f} s, {t['cpu_s']:.0f} s" if t else "not recorded"
        mine = [[c.strip() for c in r.strip().strip("|").split(" | ")] for r in rows]
        mine = [c for c in mine if c[0] == name]
        if not mine:
            lines.append(f"| {name} | not in the stored report | | {spent} |")
            continue
        counts: dict[str, int] = {}
        for c in mine:
            verdict = c[4].strip("*")
            counts[verdict] = counts.get(verdict, 0) + 1
        tally = ", ".join(f"{n} {v}" for v, n in counts.items())
        bad = ("not ", "fail", "FAIL", "VIOLATED", "DESIGN NOT MET", "INCONSISTENT")
        misses = [c[1] for c in mine if c[4].strip("*").startswith(bad)]
        if len(misses) > README_MISSES:  # the rest: the studies page
            misses = misses[:README_MISSES] + [f"and {len(misses) - README_MISSES} more"]
        lines.append(f"| {name} | {len(mine)}: {tally} | {'; '.join(misses) or 'none'} | {spent} |")
    return "\n".join(lines)


def write_readme(readme: Path = README, report: Path = REPORT) -> bool:
    """Rewrite the README's studies table between its markers; True if it changed."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{readme}: the studies table markers are missing")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    new = f"{head}{README_START}\n{readme_table(report)}\n{README_END}{tail}"
    if new != text:
        readme.write_text(new)
    return new != text


def store_report(
    src: Path, command: str, note: str = "", target: Path = REPORT, timings: Path | None = None
) -> Path:
    """Keep an ``hpcpipe analyze`` report (report.md and its figures) as the stored report
    of the studies page, with a ``record.json`` saying when, how and where it was made,
    and with ``timings`` (the ``timings.json`` of ``analysis/reproduce.py``) the wall and
    CPU time of each study. The previous stored report is replaced."""
    import datetime
    import shutil

    from hpcpipe.bench.common import machine_line

    if not (src / "report.md").is_file():
        raise SystemExit(f"store-report: {src} has no report.md (run hpcpipe analyze -o {src})")
    target.mkdir(parents=True, exist_ok=True)
    for old in [*target.glob("*.png"), *target.glob("*.md"), *target.glob("record.json")]:
        old.unlink()
    for f in [src / "report.md", *sorted(src.glob("*.png"))]:
        shutil.copy2(f, target / f.name)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rec = {"date": now, "command": command, "machine": machine_line(), "note": note}
    if timings is not None:
        rec["timings"] = json.loads(timings.read_text())
    (target / "record.json").write_text(json.dumps(rec, indent=1) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    """Write the generated pages to a folder (to read them without MkDocs), or store a
    report for the studies page."""
    p = argparse.ArgumentParser(prog="python docs/gen/pages.py", description=main.__doc__)
    p.add_argument("out", nargs="?", default="site-pages", help="folder for the pages")
    p.add_argument("--store-report", metavar="DIR", help="an hpcpipe analyze -o DIR folder")
    p.add_argument("--command", default="", help="with --store-report: what made the report")
    p.add_argument("--note", default="", help="with --store-report: how long, at what load")
    p.add_argument(
        "--timings",
        metavar="FILE",
        help="with --store-report: the timings.json of analysis/reproduce.py (each study's time)",
    )
    p.add_argument(
        "--readme",
        action="store_true",
        help="rewrite the README's studies table from the stored report (--store-report does too)",
    )
    args = p.parse_args(argv)
    if args.store_report:
        timings = Path(args.timings) if args.timings else None
        stored = store_report(Path(args.store_report), args.command, args.note, timings=timings)
        print(f"stored {stored}")
    if args.store_report or args.readme:
        changed = write_readme()
        print(f"{README}: studies table {'rewritten' if changed else 'unchanged'}")
        return 0
    target = Path(args.out)
    for rel, text in pages().items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_text(text)
        print(target / rel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
