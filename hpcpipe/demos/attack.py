"""``hpcpipe demo``: GD vs AGD vs PPRS (K = 10) on the digits attack, same pipeline budget.

Every method gets the same pipeline time budget on the model clock (τ = 1
per layer and direction), so PPRS's K samples per iteration are paid as
the paper counts them: an iteration costs 2(K·m + Δ − 1)τ with GPipe,
against 2(m + Δ − 1)τ for GD and AGD.
"""

from __future__ import annotations

import time

from hpcpipe.problems.digits import attack
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import run
from hpcpipe.run.table import table

BASE = dict(
    problem="attack",
    depth=4,
    width=32,
    m=5,
    radius=0.05,
    schedule="gpipe",
    seed=0,
    iterations=100000,
    progress="off",
)
METHODS = [
    ("GD", dict(optimizer="gd", lr=0.01)),
    ("AGD", dict(optimizer="agd", lr=0.01)),
    ("PPRS K=10", dict(optimizer="pprs", samples=10, gamma=0.01, lr=0.01)),
]


def demo(comm, budget: float = 0.0, progress: str = "auto") -> int:
    """Run the three methods on ``comm`` in one pipeline budget; rank 0 prints the table.
    ``progress`` shows the classifier's training on first use (``Waiting``)."""
    t0 = time.perf_counter()
    depth, m = BASE["depth"], BASE["m"]
    budget = budget or 40 * 2 * (10 * m + depth - 1)  # 40 PPRS iterations
    prob = attack(comm, depth, BASE["width"], m, BASE["seed"], BASE["radius"], progress=progress)
    if comm.rank == 0:
        print(
            f"hpcpipe demo: l-inf attack (radius {BASE['radius']}) on {m} digits images, "
            f"ReLU MLP depth {depth} width {BASE['width']} (test accuracy "
            f"{prob.info['classifier_test_accuracy']:.3f}), {comm.size} ranks, GPipe, "
            f"pipeline budget {budget:g} tau",
            flush=True,
        )
    rows = []
    for name, over in METHODS:
        cfg = make_config({**BASE, **over, "time_budget": budget})
        res = run(cfg, comm, label=name, problem=prob)
        last = res.last
        rows.append(
            [
                name,
                res.method.samples,
                res.method.lr,
                last.best_f,
                res.info.get("attack_success", float("nan")),
                len(res.table),
                last.pipeline_time,
                last.wall_time,
                res.status,
            ]
        )
        if comm.rank == 0:
            print(f"  {name}: done in {last.wall_time:.2f} s", flush=True)
    if comm.rank == 0:
        print(
            table(
                [
                    "method",
                    "K",
                    "lr",
                    "best margin",
                    "attack success",
                    "iterations",
                    "pipeline time (tau)",
                    "wall (s)",
                    "status",
                ],
                rows,
            )
        )
        print(f"(margin < 0 means misclassified; total {time.perf_counter() - t0:.1f} s)")
    return 0
