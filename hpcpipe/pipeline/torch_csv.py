"""torch.distributed.pipelining's CSV schedule format, read and written.

torch's ``_dump_csv`` (compute-only format) writes one row per rank, the
rank's ``pipeline_order``: actions such as ``0F0`` (stage 0, forward, item
0), ``1I0`` (input gradient), ``1W0`` (weight gradient) and ``0B0`` (full
backward), with an empty cell where the rank idles. The stage → rank
placement is the one the rows imply (a stage's actions are all on one rank).
The idle cells carry no information for hpcpipe: a rank runs its next action
as soon as its input is there, and the model clock times it.
"""

from __future__ import annotations

import csv
from pathlib import Path

from hpcpipe.pipeline.schedules import Action, Schedule, ScheduleError


def from_rows(rows: list[list[str]], name: str = "csv", n_items: int | None = None) -> Schedule:
    """A schedule from torch's rows (empty cells skipped); ``n_items`` defaults to max item + 1."""
    lists: list[list[Action]] = []
    for r, row in enumerate(rows):
        acts = []
        for col, cell in enumerate(row):
            text = cell.strip()
            if not text:
                continue
            try:
                acts.append(Action.parse(text))
            except ScheduleError:
                raise ScheduleError(
                    f"rank {r}, column {col}: {text!r} is not a compute action (F, B, I, W): "
                    "write the CSV in torch's compute-only format (_dump_csv(path, "
                    "format='compute_only'))"
                ) from None
        lists.append(acts)
    if not any(lists):
        raise ScheduleError("the CSV holds no action")
    n = n_items if n_items is not None else 1 + max(a.item for lst in lists for a in lst)
    return Schedule.from_rank_lists(name, n, lists)


def read_csv(path: str | Path, n_items: int | None = None) -> Schedule:
    """Read a schedule from torch's CSV file (named after the file)."""
    path = Path(path)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return from_rows(rows, name=path.stem, n_items=n_items)


def to_rows(schedule: Schedule) -> list[list[str]]:
    """torch's rows: each rank's actions in order (no idle cells)."""
    return [[str(a) for a in acts] for acts in schedule.rank_actions]


def write_csv(schedule: Schedule, path: str | Path) -> None:
    """Write the schedule as torch's compute-only CSV (torch's ``_load_csv`` reads it)."""
    with Path(path).open("w", newline="") as f:
        csv.writer(f).writerows(to_rows(schedule))
