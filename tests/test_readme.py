"""The README is a short door: its quickstart is what CI runs, its commands and options
exist, its links lead to files of the repository. (The examples that moved to the
documentation are run by tests/test_docs.py.)"""

import argparse
import json
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _blocks(lang: str = "bash") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def _commands() -> list[list[str]]:
    """The README's shell commands (continuation lines joined, comments dropped)."""
    out = []
    for block in _blocks():
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while "&&" in words:  # `a && b`: both commands
                i = words.index("&&")
                out.append(words[:i])
                words = words[i + 1 :]
            if words:
                out.append(words)
    return out


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 220


def test_quickstart_is_what_ci_runs():
    """The three quickstart commands, in order, are the ones .ci/run runs."""
    quick = _blocks()[0]
    lines = [shlex.split(line, comments=True) for line in quick.splitlines()]
    assert lines == [
        ["python", "-m", "pip", "install", ".[mpich,test]"],
        ["hpcpipe", "demo"],
        ["python", "-m", "pytest"],
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'python -m pip install ".[mpich,test]"' in ci
    assert "\nhpcpipe demo\n" in ci
    assert re.search(r"\npython -m pytest -v( --durations=[0-9]+)?\n", ci)  # the README's


def test_every_hpcpipe_command_and_option_in_the_readme_exists():
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "gen"))
    try:
        import pages
    finally:
        sys.path.pop(0)
    commands = pages.commands()
    seen = 0
    for words in _commands():
        if "hpcpipe" not in words:
            continue
        words = words[words.index("hpcpipe") + 1 :]
        assert words[0] in commands, words
        parser = commands[words[0]][1]
        options = {o for a in parser._actions for o in a.option_strings}
        if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            continue  # a command with sub-commands: its options are theirs
        for w in words[1:]:
            if w.startswith("--"):
                assert w.split("=")[0] in options, (words[0], w)
        seen += 1
    assert seen >= 7  # demo, run, trace, sweep, analyze; run under srun, jobs


def test_links_lead_to_files_of_the_repository():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if "://" in link:
            continue
        assert (ROOT / link).is_file(), link
    assert "docs/tutorial.md" in links and "docs/how-to/cluster.md" in links


def test_no_load_averages_or_run_history():
    text = README.read_text().lower()
    assert "load average" not in text and "load 0." not in text and "earlier run" not in text


def _pages():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_gen_pages", ROOT / "docs/gen/pages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_studies_table_is_the_generated_one_from_the_stored_report():
    pages = _pages()
    text = README.read_text()
    inside = text.split(pages.README_START, 1)[1].split(pages.README_END, 1)[0]
    assert inside.strip() == pages.readme_table().strip()
    rows, _ = pages._report_sections((ROOT / "docs/records/report/report.md").read_text())
    studies = {r.split("|")[1].strip() for r in rows}
    assert studies  # the stored report has verdict rows
    for line in pages.readme_table().splitlines()[4:]:  # a study in the report has its row
        name = line.split("|")[1].strip()
        assert ("not in the stored report" in line) == (name not in studies), line


def test_studies_table_follows_a_new_report(tmp_path):
    pages = _pages()
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.md").write_text(
        "# report\n\n| study | claim | bound | measured | verdict | executor | sources |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
        "| depth | PPRS faster past a crossover | x | y | **not reproduced** | mpi | S1 |\n"
        "| depth | time within bound | x | y | **within bound** | mpi | S1 |\n"
    )
    table = pages.readme_table(report)
    row = next(r for r in table.splitlines() if r.startswith("| depth |"))
    assert row == (
        "| depth | 2: 1 not reproduced, 1 within bound | PPRS faster past a crossover "
        "| not recorded |"
    )
    assert "| smooth | not in the stored report | | not recorded |" in table
    timings = [
        {"study": "depth", "wall_s": 300.4, "cpu_s": 580.2},
        {"study": "all", "wall_s": 1250.0, "cpu_s": 2400.0, "jobs": 2},
    ]
    (report / "record.json").write_text(json.dumps({"date": "D", "timings": timings}))
    timed = pages.readme_table(report)
    assert "took 20 min 50 s wall and 2400 s of CPU, 2 model-clock jobs at a time" in timed
    assert "| PPRS faster past a crossover | 300 s, 580 s |" in timed
    (report / "record.json").unlink()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{pages.README_START}\nold table\n{pages.README_END}\nrest\n")
    assert pages.write_readme(readme, report) is True
    assert readme.read_text() == (
        f"intro\n{pages.README_START}\n{table}\n{pages.README_END}\nrest\n"
    )
    assert pages.write_readme(readme, report) is False  # unchanged the second time
