"""The documentation: every command and every setting is in the generated pages, the
stored report and benchmark records are shown, the examples of the pages run, and the site
builds with ``mkdocs build --strict`` (when MkDocs is installed; CI installs it)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcpipe.cli.launch import mpiexec_command
from hpcpipe.run.config import GROUPS, RunConfig, shown_default

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _pages_module():
    spec = importlib.util.spec_from_file_location("docs_gen_pages", DOCS / "gen" / "pages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pages = _pages_module()


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return pages.pages()


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [
        o
        for a in parser._actions
        if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
        for o in a.option_strings
    ]


# ------------------------------------------------------------------ commands


def commands_missing(generated: dict[str, str]) -> list[str]:
    """Every sub-command of the CLI, and each of its options, absent from its page."""
    from hpcpipe.cli.main import build_parser

    top = build_parser()
    (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    index = generated.get("commands/index.md", "")
    for name in sub.choices:
        page = generated.get(f"commands/{name}.md")
        if page is None or f"]({name}.md)" not in index:
            missing.append(name)
            continue
        parser = pages.commands()[name][1]
        missing += [f"{name} {o}" for o in _options(parser) if f"`{o}" not in page]
    return missing


def test_every_command_and_option_has_its_page(generated):
    assert not commands_missing(generated)
    run = generated["commands/run.md"]
    assert "`--resume`" in run and "`--depth`" in run and "`--no-output`" in run
    analyze = generated["commands/analyze.md"]  # options parsed by a parser of its own
    assert "`--study`" in analyze and "`--trust-file`" in analyze


def test_a_command_missing_from_the_pages_is_found(generated):
    tampered = {k: v for k, v in generated.items() if k != "commands/sweep.md"}
    assert commands_missing(tampered) == ["sweep"]
    tampered = dict(generated)
    tampered["commands/jobs.md"] = tampered["commands/jobs.md"].replace("`--partition`", "")
    assert commands_missing(tampered) == ["jobs --partition"]


# ------------------------------------------------------------------ settings


def settings_missing(page: str) -> list[str]:
    """Every RunConfig field absent from its group's table, or shown with another default
    or meaning than the schema's."""
    group, seen = None, {}
    for line in page.splitlines():
        if line.startswith("## "):
            group = line[3:].strip()
        elif line.startswith("| `") and group in GROUPS:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            seen[cells[0].strip("`")] = (group, cells[3].strip("`"), cells[5])
    missing = []
    for f in dataclasses.fields(RunConfig):
        default = pages.cell(shown_default(f))
        meaning = pages.cell(f.metadata["help"])
        if seen.get(f.name) != (f.metadata["group"], default, meaning):
            missing.append(f.name)
    return missing


def test_configuration_reference_lists_every_setting_in_its_group(generated):
    page = generated["reference/configuration.md"]
    assert not settings_missing(page)
    assert [line[3:] for line in page.splitlines() if line.startswith("## ")][:6] == list(GROUPS)
    assert f"{len(dataclasses.fields(RunConfig))} settings" in page
    assert "`l1-chain`, `max-chain`" in page  # a registry's names as the allowed values


def test_a_setting_missing_or_stale_in_the_reference_is_found(generated):
    page = generated["reference/configuration.md"]
    without = "\n".join(line for line in page.splitlines() if not line.startswith("| `seed`"))
    assert settings_missing(without) == ["seed"]
    stale = page.replace("| `seed` | `--seed` | integer | `0` |", "| `seed` | x | y | `5` |")
    assert settings_missing(stale) == ["seed"]
    shown = "4, or the rank count when more ranks run (mpi executor)"
    assert f"| `depth` | `--depth` | integer | {shown} |" in page
    stale = page.replace(f"| {shown} |", "| `4` |")
    assert settings_missing(stale) == ["depth"]


# ------------------------------------------------------------------ sweep file, studies


def test_sweep_page_lists_every_table_and_key(generated):
    from hpcpipe.studies import sweep

    page = generated["reference/sweep-file.md"]
    for table in sweep.TABLES:
        assert f"| `{table}` |" in page
    for key in sweep.SWEEP_KEYS:
        assert f"| `{key}` |" in page
    assert "[grid]" in page and 'ranks = "depth"' in page  # the docstring and the example


NUMBER = r"(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
STUDY_COUNT = re.compile(rf"\b{NUMBER}\s+(?:studies|study drivers)\b", re.IGNORECASE)


def _prose_with_docstrings() -> list[tuple[str, str]]:
    """README, the hand-written pages (not the stored records) and every module's text."""
    out = [("README.md", (ROOT / "README.md").read_text())]
    out += [
        (str(p.relative_to(ROOT)), p.read_text())
        for p in sorted(DOCS.rglob("*.md"))
        if "records" not in p.parts
    ]
    code = sorted(ROOT.glob("hpcpipe/**/*.py")) + sorted(ROOT.glob("analysis/*.py"))
    out += [(str(p.relative_to(ROOT)), p.read_text()) for p in code]
    return out


def test_no_page_or_docstring_states_how_many_studies_there_are():
    """The count goes stale whenever a study is added (report.STUDIES is the list)."""
    found = [
        f"{name}: {m.group(0)!r}"
        for name, text in _prose_with_docstrings()
        for m in STUDY_COUNT.finditer(text)
    ]
    assert not found, found
    assert STUDY_COUNT.search("All seven studies, their regimes")  # what it would catch
    assert not STUDY_COUNT.search("wrote report.md: 1 study, 6 verdict rows")


def test_studies_page_has_every_study_and_the_stored_reports_rows(generated):
    from hpcpipe.studies.report import STUDIES

    page = generated["reference/studies.md"]
    for name, mod in STUDIES.items():
        assert f"\n## {name}\n" in page
        first = mod.__doc__.splitlines()[0].strip().replace("``", "`")
        assert first in page, name
    report = DOCS / "records" / "report" / "report.md"
    if report.is_file():
        rows, _ = pages._report_sections(report.read_text())
        assert rows and all(r in page for r in rows)
        for fig in re.findall(r"!\[[^\]]*\]\(([^)/]+)\)", report.read_text()):
            assert (report.parent / fig).is_file(), fig
            assert f"(../records/report/{fig})" in page


def test_studies_page_from_a_report(tmp_path):
    """A report's rows land under their study, its figures relinked; no report: a note."""
    (tmp_path / "report.md").write_text(
        "# hpcpipe scaling report\n\n| study | claim | bound | measured | verdict | executor "
        "| sources |\n| --- | --- | --- | --- | --- | --- | --- |\n"
        "| smooth | planted claim | b | m | **within bound** | mpi | S1 (1 file) |\n\n"
        "## smooth\n\n- planted note\n![smooth](smooth.png)\n"
    )
    page = pages.studies_page(tmp_path)
    part = page[page.index("\n## smooth\n") : page.index("\n## lower\n")]
    assert "planted claim" in part and "planted note" in part
    assert "(../records/report/smooth.png)" in part
    assert "Not in the stored report" in page[page.index("\n## depth\n") :]
    assert "No report is stored yet" in pages.studies_page(tmp_path / "none")


# ------------------------------------------------------------------ benchmark records


def test_benchmark_page_shows_each_record(tmp_path, monkeypatch):
    from hpcpipe.bench.common import RECORDS_ENV, write_record

    monkeypatch.setenv(RECORDS_ENV, str(tmp_path))
    path = write_record("unit", ["size (B)", "time (us)"], [[8, 1.25], [64, 2.5]], sane=True)
    rec = json.loads(path.read_text())
    page = pages.benchmarks_page(tmp_path)
    assert rec["date"] in page and "`unit`" in page and rec["command"] in page
    assert "| size (B) | time (us) |" in page and "| 64 | 2.5 |" in page
    assert f"{rec['load_start'][0]:.2f}" in page and rec["versions"]["numpy"] in page


def test_benchmark_page_holds_each_goal(tmp_path, monkeypatch):
    """A record with a goal is in the goals table, met or not; a record without is not."""
    from hpcpipe.bench.common import RECORDS_ENV, write_record

    monkeypatch.setenv(RECORDS_ENV, str(tmp_path))
    goal = {"figure": "step/bare", "at_most": 1.05}
    write_record("unit", ["width", "step/bare"], [[64, 1.031], [256, 1.049]], True, goal=goal)
    write_record("late", ["width", "step/bare"], [[64, 1.031], [256, 1.062]], True, goal=goal)
    write_record("free", ["width", "step/bare"], [[64, 9.0]], True)
    page = pages.benchmarks_page(tmp_path)
    rows = {line.split("`")[1]: line for line in page.splitlines() if "step/bare <= 1.05" in line}
    assert set(rows) == {"unit", "late"}
    assert "1.031, 1.049 | yes |" in rows["unit"]
    assert "1.031, 1.062 | **no** |" in rows["late"]


def test_benchmark_records_of_one_second_have_their_own_anchors(tmp_path, monkeypatch):
    """Two runs of a case that start in the same second (two processes) get two sections,
    each linked from the tables by an id of its own."""
    from hpcpipe.bench.common import RECORDS_ENV, write_record

    monkeypatch.setenv(RECORDS_ENV, str(tmp_path))
    rec = json.loads(write_record("unit", ["width", "t (us)"], [[64, 1.0]], True).read_text())
    (tmp_path / "copy.json").write_text(json.dumps({**rec, "rows": [[64, 2.0]]}))
    page = pages.benchmarks_page(tmp_path)
    ids = re.findall(r"\{#([a-z0-9-]+)\}", page)
    assert len(ids) == 2 and len(set(ids)) == 2
    assert all(f"](#{i})" in page for i in ids)


def test_stored_benchmark_records_are_complete():
    for path in sorted((DOCS / "records" / "bench").glob("*.json")):
        rec = json.loads(path.read_text())
        for key in ("case", "date", "command", "machine", "versions", "load_start", "rows"):
            assert rec.get(key), (path.name, key)
        assert all(len(row) == len(rec["headings"]) for row in rec["rows"]), path.name


# ------------------------------------------------------------------ examples of the pages


def test_oracle_example_runs_on_4_ranks_and_frees_its_requests(tmp_path):
    """'One oracle call': under mpiexec -n 4, one line of output and not one MPICH warning
    (an engine left open prints "freeing inactive persistent request" per request at exit)."""
    text = (DOCS / "explanation" / "pipeline.md").read_text()
    section = text[text.index("## One oracle call") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "script.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = mpiexec_command(4, [str(script)])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "MPICH" not in p.stderr and "persistent request" not in p.stderr, p.stderr
    loss, time = (float(x) for x in p.stdout.split())
    assert loss > 0 and time > 0


def _module_table() -> list[str]:
    text = (DOCS / "reference" / "modules.md").read_text()
    return [line for line in text.splitlines() if line.startswith("| `")]


def test_module_table_names_every_module_and_only_modules_that_exist():
    """Each module of the package is in the modules page's table (by its dotted name, or
    by its name in its package's row), and every dotted name there imports."""
    rows = _module_table()
    named = set(re.findall(r"`(hpcpipe(?:\.\w+)+)`", "\n".join(rows)))
    for name in sorted(named):
        importlib.import_module(name)
    package = ROOT / "hpcpipe"
    missing = []
    for path in sorted(package.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        dotted, parent, stem = ".".join(parts), ".".join(parts[:-1]), parts[-1]
        in_row = any(
            (f"`{parent}`" in row or f"`{parent}." in row)
            and (f"`{stem}`" in row or f"`.{stem}`" in row)
            for row in rows
        )
        if dotted not in named and not in_row:
            missing.append(dotted)
    assert not missing, f"modules missing from docs/reference/modules.md: {missing}"


# ------------------------------------------------------------------ the site


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (pip install '.[docs]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for page in ("commands/bench", "reference/configuration", "reference/studies", "tutorial"):
        assert (site / page / "index.html").is_file(), page
    html = (site / "reference" / "configuration" / "index.html").read_text()
    assert all(f.name in html for f in dataclasses.fields(RunConfig))


def test_configuration_reference_states_the_defaults_that_follow_other_settings():
    page = pages.configuration_page()
    for name in ("samples", "gamma", "depth"):
        f = next(f for f in dataclasses.fields(RunConfig) if f.name == name)
        row = next(r for r in page.splitlines() if r.startswith(f"| `{name}` |"))
        assert f.metadata["shown"] in row
    assert "`samples = 10` and `gamma = 0.01`" in page
