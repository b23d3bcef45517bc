"""A chain of Householder layers applied as one product: the fused O(d) evaluation.

A chain of Δ ``layers.Householder`` blocks is Q = Q₁⋯Q_Δ = H₁H₂⋯H_N, N = rΔ
reflectors H_i = I − τ_i u_i u_iᵀ (τ_i = 2/‖u_i‖²), with the rows u_i stacked in
block order (block b's r reflectors are rows rb … rb + r − 1). Applied one by
one, a row costs 4Nd flops in N small vector operations; here consecutive
reflectors are grouped into panels of ``nb`` and each panel is applied with
its compact WY form (Schreiber & Van Loan 1989; the "UT transform" of
Joffrain, Low, Quintana-Ortí, van de Geijn & Van Zee, ACM TOMS 32(2), 2006):

    H_a⋯H_b = I − Uᵀ T U,   T⁻¹ = diag(1/τ_i) + triu(U Uᵀ, 1),

U the panel's rows (nb × d), T upper triangular (nb × nb). So
x Q_panel = x − ((x Uᵀ) T) U and, for the backward, dy Q_panelᵀ = dy − ((dy Uᵀ) Tᵀ) U
with the panels in reverse order: three matrix products per panel, the same
4Nd flops as BLAS-3 calls. Memory N·d for U plus N·nb for the T's: O(Δd), where
the dense fused chain needs d² and the dense layers Δd².

The product equals the layer-by-layer evaluation up to rounding (tested to
1e-12). The chain of depth Δ' ≤ Δ is a prefix of the chain of depth Δ (block b
depends on (seed, b, d) only), so one chain per (seed, d) serves every depth of
a study: ``apply(x, depth)`` uses its first r·depth reflectors.
"""

from __future__ import annotations

import numpy as np

from hpcpipe.model import rng
from hpcpipe.model.layers import REFLECTORS, Householder

Array = np.ndarray


def block_vectors(seed: int, b: int, d: int, reflectors: int = REFLECTORS) -> Array:
    """Block b's reflector vectors (r × d), from ``rng.init_generator(seed, b)``: the same
    numbers as ``Householder.init`` for that block."""
    return Householder.init(rng.init_generator(seed, b), d, reflectors).u


def panel_size(d: int) -> int:
    """Reflectors per WY panel: 64 for large d; fewer for small d, where the off-diagonal
    of U Uᵀ is O(1) and a long panel's T would amplify rounding."""
    return max(1, min(64, d // 8))


def panel_t(u: Array) -> Array:
    """T of the compact WY form of H(u₁)⋯H(u_n): T⁻¹ = diag(‖u_i‖²/2) + triu(U Uᵀ, 1)."""
    g = u @ u.T
    t_inv = np.triu(g, 1)
    t_inv[np.diag_indices_from(t_inv)] = 0.5 * np.diag(g)
    from scipy.linalg import solve_triangular  # here only: MPI ranks of other runs never load scipy

    return solve_triangular(t_inv, np.eye(len(u)), lower=False)


class ReflectorChain:
    """Q = H₁⋯H_N of a Householder chain, for every prefix of whole blocks (module doc)."""

    def __init__(self, seed: int, d: int, depth: int, reflectors: int = REFLECTORS):
        self.seed, self.d, self.reflectors = seed, d, reflectors
        self.depth = 0
        self.u = np.empty((0, d))
        self.nb = panel_size(d)
        self._t: list[Array] = []  # T of the full panels
        self._tail: dict[int, Array] = {}  # T of a partial last panel, by its length
        self.extend(depth)

    def extend(self, depth: int) -> None:
        """Hold at least ``depth`` blocks (drawing only the new ones)."""
        if depth <= self.depth:
            return
        new = [
            block_vectors(self.seed, b, self.d, self.reflectors) for b in range(self.depth, depth)
        ]
        self.u = np.concatenate([self.u, *new])
        self.depth = depth
        n_full = len(self.u) // self.nb
        for p in range(len(self._t), n_full):
            self._t.append(panel_t(self.u[p * self.nb : (p + 1) * self.nb]))
        self._tail.clear()

    @property
    def nbytes(self) -> int:
        return self.u.nbytes + sum(t.nbytes for t in self._t)

    def _panels(self, depth: int) -> list[tuple[Array, Array]]:
        """(U, T) of the panels of the first ``depth`` blocks, in order."""
        if not 1 <= depth <= self.depth:
            raise ValueError(f"the chain holds {self.depth} blocks, asked for {depth}")
        n = depth * self.reflectors
        full = n // self.nb
        out = [(self.u[p * self.nb : (p + 1) * self.nb], self._t[p]) for p in range(full)]
        rest = n - full * self.nb
        if rest:
            u = self.u[full * self.nb : n]
            t = self._tail.get(n)
            if t is None:
                t = self._tail[n] = panel_t(u)
            out.append((u, t))
        return out

    def forward(self, x: Array, depth: int) -> Array:
        """x Q₁⋯Q_depth (rows of x)."""
        y = np.array(x, dtype=np.float64, copy=True)
        for u, t in self._panels(depth):
            y -= ((y @ u.T) @ t) @ u
        return y

    def backward(self, dy: Array, depth: int) -> Array:
        """dy (Q₁⋯Q_depth)ᵀ: the panels in reverse, each with Tᵀ."""
        x = np.array(dy, dtype=np.float64, copy=True)
        for u, t in reversed(self._panels(depth)):
            x -= ((x @ u.T) @ t.T) @ u
        return x


_CHAINS: dict[tuple[int, int, int], ReflectorChain] = {}


def reflector_chain(seed: int, d: int, depth: int, reflectors: int = REFLECTORS) -> ReflectorChain:
    """The process's chain for (seed, d), extended to ``depth`` blocks (at most 4 kept)."""
    key = (seed, d, reflectors)
    chain = _CHAINS.get(key)
    if chain is None:
        if len(_CHAINS) >= 4:
            _CHAINS.pop(next(iter(_CHAINS)))
        chain = _CHAINS[key] = ReflectorChain(seed, d, depth, reflectors)
    chain.extend(depth)
    return chain


def clear_reflector_chains() -> None:
    """Forget the kept chains."""
    _CHAINS.clear()


__all__ = [
    "ReflectorChain",
    "block_vectors",
    "clear_reflector_chains",
    "panel_size",
    "panel_t",
    "reflector_chain",
]
