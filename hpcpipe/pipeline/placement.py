"""Placement-aware message costs: which pipeline hops cross nodes, and what each one costs.

The MPI engine runs stage s on rank s, so the hop between stages s and s + 1
(both directions: activations forward, gradients backward) crosses the network
exactly when ranks s and s + 1 sit on different hosts. A message of n bytes
on a hop costs (docs/multinode.md):

    α_intra + n·β_intra   both ranks on one node (shared memory),
    α_inter + n·β_inter   ranks on different nodes (the interconnect).

This is the model clock's rule (``clocks``: a receive completes at
max(local clock, send stamp + α + n·β)) with α, β chosen per hop. Messages
that share a link are not made to queue behind each other: a prediction is
only as good as that assumption, so it holds where each link carries one
message at a time (e.g. one work item per call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkCosts:
    """α (s) and β (s/byte) of a message inside a node and between nodes."""

    alpha_intra: float = 0.0
    beta_intra: float = 0.0
    alpha_inter: float = 0.0
    beta_inter: float = 0.0

    @property
    def zero(self) -> bool:
        return not (self.alpha_intra or self.beta_intra or self.alpha_inter or self.beta_inter)

    def message(self, nbytes: int, crosses: bool) -> float:
        """α + n·β of the hop's kind."""
        if crosses:
            return self.alpha_inter + nbytes * self.beta_inter
        return self.alpha_intra + nbytes * self.beta_intra


def crossings(rank_hosts: Sequence[str], n_stages: int) -> list[bool]:
    """For each boundary s (stage s to s + 1, stage s on rank s): does it cross nodes?"""
    if len(rank_hosts) < n_stages:
        raise ValueError(
            f"{len(rank_hosts)} host names for {n_stages} stages: one per rank is needed"
        )
    return [rank_hosts[s] != rank_hosts[s + 1] for s in range(n_stages - 1)]


def hop_costs(
    links: LinkCosts,
    crosses: Sequence[bool],
    boundary_widths: Sequence[int],
    item_rows: Sequence[int],
    itemsize: int = 8,
) -> list[list[float]]:
    """c[s][i]: cost of item i's message across boundary s (the simulator's ``message``).

    bytes = rows_i · width_s · itemsize, the payload the engine sends (as
    ``simulator.message_costs``; the trailing clock stamp is not counted).
    """
    if len(crosses) != len(boundary_widths):
        raise ValueError(f"{len(crosses)} boundaries placed, {len(boundary_widths)} widths")
    return [
        [links.message(r * w * itemsize, x) for r in item_rows]
        for x, w in zip(crosses, boundary_widths)
    ]


def describe(rank_hosts: Sequence[str]) -> str:
    """``n1:0-1 n2:2-3``: each host with the ranks it runs, in rank order."""
    out: list[tuple[str, list[int]]] = []
    for r, h in enumerate(rank_hosts):
        if out and out[-1][0] == h:
            out[-1][1].append(r)
        else:
            out.append((h, [r]))
    return " ".join(f"{h}:{rs[0]}" if len(rs) == 1 else f"{h}:{rs[0]}-{rs[-1]}" for h, rs in out)
