"""torch.distributed.pipelining's own schedule lists, built without a process group.

A schedule class reads only a few attributes of its stages to make its
``pipeline_order``; these stand-ins carry them. Used by the live comparison
tests (``peer`` extra) and to write tests/data/torch_*.csv with torch's own
``_dump_csv``: ``python tests/peer_torch.py tests/data``.
"""

from __future__ import annotations

import sys
from pathlib import Path


class _Stage:
    def __init__(self, index: int, n_stages: int, size: int, rank: int):
        import torch

        self.stage_index, self.num_stages = index, n_stages
        self.group_size, self.group_rank = size, rank
        self.submod = torch.nn.Linear(1, 1)
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.has_backward, self.scale_grads, self.dw_builder = True, True, None
        self.stage_index_to_group_rank: dict = {}


# hpcpipe name -> (torch class name, local stages of rank r for P ranks)
CLASSES = {
    "zb-h1": ("ScheduleInterleavedZeroBubble", lambda r, P, v: [r]),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", lambda r, P, v: [r + k * P for k in range(v)]),
    "looped-bfs": ("ScheduleLoopedBFS", lambda r, P, v: [r + k * P for k in range(v)]),
    "zb-v": ("ScheduleZBVZeroBubble", lambda r, P, v: [r, 2 * P - 1 - r]),
}


def schedule_object(name: str, P: int, n: int, v: int = 2, rank: int = 0):
    """torch's schedule object for ``name`` as seen from ``rank``."""
    from torch.distributed.pipelining import schedules as T

    cls_name, local = CLASSES[name]
    idx = local(rank, P, v)
    S = P * (2 if name == "zb-v" else (1 if name == "zb-h1" else v))
    return getattr(T, cls_name)([_Stage(i, S, P, rank) for i in idx], n)


def pipeline_order(name: str, P: int, n: int, v: int = 2) -> list[list[str]]:
    """Every rank's actions as torch orders them, idle steps left out."""
    order = schedule_object(name, P, n, v).pipeline_order
    return [[str(a) for a in order[r] if a is not None] for r in range(P)]


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name, fname in (
        ("zb-v", "torch_zbv_4x8.csv"),
        ("zb-h1", "torch_zbh1_4x8.csv"),
        ("interleaved-1f1b", "torch_interleaved_4x8.csv"),
    ):
        schedule_object(name, 4, 8)._dump_csv(str(out / fname), format="compute_only")
