"""Plain-text tables of runs (rank 0)."""

from __future__ import annotations

import math

from hpcpipe.run.outcome import describe
from hpcpipe.run.runner import COLUMNS, RunResult


def fmt(v: float) -> str:
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if float(v).is_integer() and abs(v) < 1e9:
        return str(int(v))
    return f"{v:.4g}"


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[fmt(c) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def print_run(res: RunResult, every: int = 0) -> None:
    rows = res.table.tolist()
    n = len(rows)
    step = every or max(1, n // 20)
    keep = [r for i, r in enumerate(rows) if i % step == 0 or i == n - 1]
    print(table(list(COLUMNS), keep))
    m = res.method
    print(
        f"status {res.status}; method {m.name} lr {m.lr:.4g} gamma {m.gamma:.4g} "
        f"K {m.samples}; {n} iterations; info {res.info}"
    )
    for line in describe(res.info):
        print(line)
