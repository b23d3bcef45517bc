"""Run every study whose data are present and write report.md with its figures.

Exit status 1 when a row that is enforced fails — a bound ("VIOLATED"), a
consistency check ("INCONSISTENT") or the study's own design ("DESIGN NOT MET":
the runs are not the regime the study claims to test) —, 0 otherwise; claim rows
are reported as reproduced or not and do not fail.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcpipe.optional import available, missing_message
from hpcpipe.registry import names_from
from hpcpipe.run import atomic
from hpcpipe.studies import (
    depth,
    depth_wall,
    dimension,
    lower,
    nonconvex,
    paper,
    pipeline_time,
    points,
    schedules,
    smooth,
)
from hpcpipe.studies.common import StudyResult, load_records

STUDIES = {
    m.NAME: m
    for m in (
        pipeline_time,
        depth,
        depth_wall,
        dimension,
        smooth,
        lower,
        nonconvex,
        paper,
        schedules,
    )
}


def _fmt(v) -> str:
    """A table cell: floats to 4 digits; a '|' (a norm such as ||grad f||) escaped, so it
    does not split the Markdown row."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|")


def source_refs(results: list[StudyResult]) -> tuple[list[str], dict[tuple[str, ...], str]]:
    """Short references (S1, S2, ...) for the distinct file lists of the verdict rows."""
    refs: dict[tuple[str, ...], str] = {}
    for res in results:
        for v in res.verdicts:
            refs.setdefault(tuple(v.files), f"S{len(refs) + 1}")
    appendix = ["", "## Sources", ""]
    for files, ref in refs.items():
        appendix.append(f"- **{ref}**: {', '.join(files)}")
    return appendix, refs


def _row(v, refs: dict[tuple[str, ...], str]) -> str:
    n = len(v.files)
    src = f"{refs[tuple(v.files)]} ({n} file{'' if n == 1 else 's'})"
    cells = [v.study, v.claim, v.bound, v.measured, f"**{v.word}**", v.executor or "-", src]
    return "| " + " | ".join(_fmt(c) for c in cells) + " |"


def write_report(results: list[StudyResult], outdir: Path, sources: list[str]) -> Path:
    appendix, refs = source_refs(results)
    lines = [
        "# hpcpipe scaling report",
        "",
        f"Results read from: {', '.join(sources)}. The `sources` column refers to the "
        "file lists under Sources at the end.",
        "",
    ]
    checks = [v for res in results for v in res.verdicts if v.kind == "consistency"]
    if any(v.kind != "consistency" for res in results for v in res.verdicts):
        lines += [
            "| study | claim | bound | measured | verdict | executor | sources |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
    else:
        lines.append("No verdict rows: no built-in study's runs (tags) in these folders.")
    for res in results:
        for v in res.verdicts:
            if v.kind != "consistency":
                lines.append(_row(v, refs))
    if checks:
        lines += [
            "",
            "Consistency checks (they hold by construction when the code is right; "
            "not evidence for a claim):",
            "",
            "| study | check | reference | measured | verdict | executor | sources |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_row(v, refs) for v in checks]
    lines += [
        "",
        "executor: `simulated` rows come from the simulated pipeline (one process, "
        "simulator time on the model clock); `mpi` rows were measured on MPI ranks.",
    ]
    for res in results:
        lines += ["", f"## {res.name}", ""]
        lines += [f"- {n}" for n in res.notes]
        for fig in res.figures:
            lines += [f"![{res.name}]({fig})", ""]
        for title, head, rows in res.tables:
            lines += [
                f"### {title}",
                "",
                "| " + " | ".join(head) + " |",
                "|" + " --- |" * len(head),
            ]
            lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
            lines.append("")
    lines += appendix
    path = outdir / "report.md"
    atomic.write_text(path, "\n".join(lines) + "\n")  # whole or not at all
    return path


def analyse(
    dirs: list[str],
    outdir: str | Path,
    only: list[str] | None = None,
    warn=None,
    trust_files: bool = False,
) -> tuple[list[StudyResult], Path]:
    """Every study's rows from the result files under ``dirs``, written to ``outdir``.

    A ``package.module:attribute`` name that a file records is not imported (it would run
    code that the person analysing did not choose) unless ``trust_files``.
    """
    with names_from(f"the results under {', '.join(dirs)}", trusted=trust_files):
        return _analyse(dirs, outdir, only, warn)


def _analyse(dirs, outdir, only, warn) -> tuple[list[StudyResult], Path]:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    per_dir = [(d, load_records(d, warn=warn)) for d in dirs]
    records = [r for _, recs in per_dir for r in recs]
    results = []
    for name, mod in STUDIES.items():
        if only and name not in only:
            continue
        tagged = [r for r in records if str(r.config.get("tag", "")).split("/")[0] == name]
        res = mod.study(tagged, outdir)
        where = {r.file: r.executor for r in tagged}
        for v in res.verdicts:  # which executor produced each row's numbers
            if not v.executor:
                v.executor = " + ".join(sorted({where[f] for f in v.files if f in where}))
        if res.verdicts or res.tables:
            results.append(res)
    if not only or points.NAME in only:  # the rest: points of the user's own sweeps
        for d, recs in per_dir:
            own = [r for r in recs if str(r.config.get("tag", "")).split("/")[0] not in STUDIES]
            if own:
                results.append(points.study(own, outdir, d))
    return results, write_report(results, outdir, dirs)


def parser() -> argparse.ArgumentParser:
    """The options of ``hpcpipe analyze``."""
    p = argparse.ArgumentParser(prog="hpcpipe analyze", description=__doc__)
    p.add_argument("dirs", nargs="+", help="directories of result files (searched recursively)")
    p.add_argument("-o", "--out", default="report", help="report directory")
    p.add_argument(
        "--study",
        action="append",
        choices=[*sorted(STUDIES), points.NAME],
        help="only these studies (repeatable); points: the table of a sweep's own points",
    )
    p.add_argument(
        "--trust-file",
        action="store_true",
        help="import the package.module:attribute names the result files record (runs their "
        "code; by default such names are not imported, and rows that need them are left out)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    from hpcpipe.run.config import path_error

    args = parser().parse_args(argv)
    bad = [path_error("results folder", d, write=False) for d in args.dirs]
    bad += [path_error("-o", args.out, write=True)]
    for err in filter(None, bad):
        print(f"hpcpipe analyze: {err}", file=sys.stderr)
        return 2
    for d in args.dirs:
        if not Path(d).is_dir():
            what = "is a file, not a folder" if Path(d).exists() else "does not exist"
            print(f"hpcpipe analyze: results folder {d!r} {what}", file=sys.stderr)
            return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir() or not out.exists() and out.parent.is_file():
        print(f"hpcpipe analyze: -o {args.out!r} must be a folder", file=sys.stderr)
        return 2
    if not available("matplotlib"):  # before any work: every study draws its figures
        print(f"hpcpipe: {missing_message('matplotlib', 'plot', 'analyze')}", file=sys.stderr)
        return 2
    results, path = analyse(args.dirs, args.out, args.study, trust_files=args.trust_file)
    bad = [
        v
        for r in results
        for v in r.verdicts
        if v.kind != "claim" and v.ok is False and not v.not_enforced
    ]
    n = sum(len(r.verdicts) for r in results)
    studies = f"{len(results)} stud{'y' if len(results) == 1 else 'ies'}"
    print(f"wrote {path}: {studies}, {n} verdict rows, {len(bad)} enforced rows failed")
    for v in bad:
        print(f"{v.word} [{v.study}] {v.claim}: {v.measured} (bound: {v.bound})")
    if not results:
        print(f"no result files under {', '.join(args.dirs)}")
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
