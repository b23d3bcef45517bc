"""A result's tables as CSV or Parquet files, for tools outside Python.

One file per table, named ``<prefix>-iterations.<ext>``, ``-timeline`` and
``-stages``, plus ``<prefix>-attributes.json`` (the root attributes: config,
provenance, status, figures). Columns keep the schema order of
docs/results.md; floats are written with all the digits needed to read back
the same float64 (CSV) or as float64 (Parquet).
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np

from hpcpipe.optional import install_hint, need
from hpcpipe.run import atomic
from hpcpipe.run.results import Result

FORMATS = ("csv", "parquet")
TABLES = ("iterations", "timeline", "stages")
PARQUET_NEEDS = f"--format parquet needs {install_hint('pyarrow', 'data')} (or use --format csv)"


class ExportError(ValueError):
    """An export that cannot be made; nothing was written."""


def _cell(v) -> str:
    return repr(float(v)) if isinstance(v, (float, np.floating)) else str(int(v))


def write_csv(columns: dict[str, np.ndarray], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(list(columns))
        for row in zip(*columns.values()):
            w.writerow([_cell(v) for v in row])


def read_csv(path: str | Path) -> dict[str, np.ndarray]:
    """The columns of an exported CSV file (int64 where every cell is an integer)."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    head, body = rows[0], rows[1:]
    out = {}
    for j, name in enumerate(head):
        cells = [r[j] for r in body]
        is_int = all(c.lstrip("-").isdigit() for c in cells) and bool(cells)
        out[name] = np.array(cells, dtype=np.int64 if is_int else float)
    return out


def write_parquet(columns: dict[str, np.ndarray], path: Path) -> None:
    pa = need("pyarrow", "data", "--format parquet")
    pq = need("pyarrow.parquet", "data", "--format parquet")

    pq.write_table(pa.table({k: np.asarray(v) for k, v in columns.items()}), path)


def targets(prefix: str | Path, fmt: str) -> list[Path]:
    p = Path(prefix)
    return [p.with_name(f"{p.name}-{t}.{fmt}") for t in TABLES] + [
        p.with_name(f"{p.name}-attributes.json")
    ]


def export(result: Result, fmt: str, prefix: str | Path) -> list[Path]:
    """Write the three tables and the attributes; ExportError before writing anything.

    Each file is written whole or not at all (``atomic.write``); if one fails (a full
    disk), the files this export wrote before it are removed too, so that no partial
    export is left (the targets did not exist before), and the OSError is raised.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ExportError(PARQUET_NEEDS)
    paths = targets(prefix, fmt)
    there = [str(p) for p in paths if p.exists()]
    if there:
        raise ExportError(
            f"{', '.join(there)} exist already: choose another --output prefix or delete them"
        )
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    write = write_csv if fmt == "csv" else write_parquet
    attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in result.attrs.items()}
    done = []
    try:
        for table, path in zip(TABLES, paths):
            done.append(atomic.write(path, lambda tmp, t=table: write(result.columns(t), tmp)))
        text = json.dumps(attrs, indent=1, sort_keys=True, default=str) + "\n"
        done.append(atomic.write_text(paths[-1], text))
    except BaseException:
        for path in done:
            path.unlink(missing_ok=True)
        raise
    return paths
