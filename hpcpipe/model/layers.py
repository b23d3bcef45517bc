"""Numpy layers with batched forward and backward passes (float64 by default).

A layer maps a batch ``x`` of shape (rows, n_in) to (rows, n_out). Parameters
are passed explicitly to ``forward`` so that a stage can evaluate the same
layer at perturbed weights W + γZ (PPRS smoothing in weight space) without
touching the base weights. ``backward`` returns dL/dx and *accumulates* the
parameter gradients into caller-owned arrays, so gradients over many work
items sum in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Array = np.ndarray

_UNSET = object()
_dgemm: Any = _UNSET  # scipy's BLAS dgemm, imported on the first weight gradient


def load_blas() -> Any:
    """scipy.linalg.blas.dgemm, or None without scipy; imported on first use.

    Importing scipy.linalg costs about 0.25 s of start-up per process, which a
    rank pays only when it accumulates a weight gradient (the variable is the
    weights); a rank whose variable is the input never imports it. An executor
    whose variable is the weights calls this at set-up, so that the import is
    not timed inside its first call.
    """
    global _dgemm
    if _dgemm is _UNSET:
        try:  # in-place GEMM accumulate C += A B (no temporary of the weight's size)
            from scipy.linalg.blas import dgemm
        except ImportError:  # pragma: no cover
            dgemm = None
        _dgemm = dgemm
    return _dgemm


def accumulate_outer(gw: Array, x: Array, dy: Array) -> None:
    """gw += xᵀ dy in place.

    With BLAS dgemm on gwᵀ (Fortran order, beta = 1) the product is added
    into gw directly: for a (1024, 1024) weight and one row this is a rank-1
    update instead of a 8 MB temporary plus an add (about 10x faster).
    """
    if (
        gw.dtype == np.float64
        and gw.flags.c_contiguous
        and x.dtype == np.float64
        and dy.dtype == np.float64
        and (dgemm := load_blas()) is not None
    ):
        xc, dyc = np.ascontiguousarray(x), np.ascontiguousarray(dy)
        dgemm(1.0, dyc.T, xc.T, beta=1.0, c=gw.T, trans_b=1, overwrite_c=1)
    else:
        gw += x.T @ dy


class Layer:
    """Base class: a differentiable map (rows, n_in) -> (rows, n_out)."""

    name = "layer"
    n_in: int
    n_out: int

    def params(self) -> list[Array]:
        """The layer's trainable parameters (the arrays themselves)."""
        return []

    def forward(self, x: Array, params: Sequence[Array]) -> tuple[Array, Any]:
        """Return (y, cache); ``cache`` is what backward needs."""
        raise NotImplementedError

    def backward(
        self, dy: Array, cache: Any, params: Sequence[Array], grads: Sequence[Array] | None
    ) -> Array:
        """Return dL/dx; add dL/dparams into ``grads`` when it is not None."""
        raise NotImplementedError

    def forward_into(self, x: Array, params: Sequence[Array], out: Array) -> Any:
        """``forward`` with the output written into ``out`` (rows, n_out); returns the cache.

        The engine passes the item's send buffer as ``out``, so the output is not
        copied again; ``out`` is not written again before the item's backward, so
        the cache may refer to it. This default copies ``forward``'s output; a
        layer may override it to compute into ``out`` directly.
        """
        y, cache = self.forward(x, params)
        np.copyto(out, y)
        return cache

    def backward_into(
        self,
        dy: Array,
        cache: Any,
        params: Sequence[Array],
        grads: Sequence[Array] | None,
        out: Array | None,
    ) -> None:
        """``backward`` with dL/dx written into ``out``; with ``out`` None dL/dx is not
        wanted (the first stage when the input is not a variable) and only the
        parameter gradients are accumulated."""
        if out is None:
            only = getattr(self, "backward_params", None)
            if only is not None:
                only(dy, cache, params, grads)
                return
        dx = self.backward(dy, cache, params, grads)
        if out is not None:
            np.copyto(out, dx)

    def __repr__(self) -> str:
        return f"{self.name}({self.n_in}->{self.n_out})"


class Dense(Layer):
    """Affine map y = x W + b, W of shape (n_in, n_out).

    dL/dW = xᵀ dy, dL/db = Σ_rows dy, dL/dx = dy Wᵀ.
    """

    name = "dense"

    def __init__(self, weight: Array, bias: Array):
        if weight.ndim != 2 or bias.shape != (weight.shape[1],):
            raise ValueError(f"dense: weight {weight.shape} and bias {bias.shape} do not fit")
        self.weight, self.bias = weight, bias
        self.n_in, self.n_out = weight.shape

    @classmethod
    def init(cls, rng: np.random.Generator, n_in: int, n_out: int, dtype=np.float64) -> Dense:
        """He initialisation: W ~ N(0, 2/n_in), b = 0.01 (keeps ReLUs alive)."""
        w = rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)
        b = np.full(n_out, 0.01)
        return cls(w.astype(dtype), b.astype(dtype))

    def params(self) -> list[Array]:
        return [self.weight, self.bias]

    def forward(self, x, params):
        w, b = params
        y = x @ w
        y += b  # in place: one temporary fewer than x @ w + b, the same numbers
        return y, x

    def backward(self, dy, cache, params, grads):
        self.backward_params(dy, cache, params, grads)
        return dy @ params[0].T

    def forward_into(self, x, params, out):
        """y = x W + b computed in ``out`` (the same two operations as ``forward``)."""
        w, b = params
        np.matmul(x, w, out=out)
        out += b
        return x

    def backward_into(self, dy, cache, params, grads, out):
        """dL/dW += xᵀdy, dL/db += Σ_rows dy, and dL/dx = dy Wᵀ into ``out``.

        ``backward_params`` written out, as this runs once per action in the engine.
        """
        if grads is not None:
            gw, gb = grads
            accumulate_outer(gw, cache, dy)
            gb += dy.sum(axis=0)
        if out is not None:
            np.matmul(dy, params[0].T, out=out)

    def backward_params(self, dy, cache, params, grads) -> None:
        """Only the parameter part of ``backward``: dL/dW and dL/db, no dL/dx."""
        if grads is not None:
            gw, gb = grads
            accumulate_outer(gw, cache, dy)
            gb += dy.sum(axis=0)


class ReLU(Layer):
    """y = max(x, 0); dL/dx = dy · 1[x > 0] (subgradient 0 at the kink)."""

    name = "relu"

    def __init__(self, n: int):
        self.n_in = self.n_out = n

    def forward(self, x, params):
        mask = x > 0
        return np.where(mask, x, 0.0), mask

    def backward(self, dy, cache, params, grads):
        return np.where(cache, dy, 0.0)


class Orthogonal(Layer):
    """A fixed orthogonal map y = x Q (QᵀQ = I): norm preserving, not trained.

    Used by the convex chain problems: composing orthogonal layers keeps f
    convex with the same Lipschitz constant and the same ‖θ₀ − θ*‖.
    """

    name = "orthogonal"

    def __init__(self, q: Array):
        if q.ndim != 2 or q.shape[0] != q.shape[1]:
            raise ValueError(f"orthogonal: need a square matrix, got {q.shape}")
        self.q = q
        self.n_in = self.n_out = q.shape[0]

    @classmethod
    def init(cls, rng: np.random.Generator, n: int, dtype=np.float64) -> Orthogonal:
        """Haar-random orthogonal matrix: QR of a Gaussian matrix with sign fix."""
        a = rng.standard_normal((n, n))
        q, r = np.linalg.qr(a)
        q *= np.sign(np.diag(r))
        return cls(q.astype(dtype))

    def forward(self, x, params):
        return x @ self.q, None

    def backward(self, dy, cache, params, grads):
        return dy @ self.q.T

    def forward_into(self, x, params, out):
        np.matmul(x, self.q, out=out)

    def backward_into(self, dy, cache, params, grads, out):
        if out is not None:
            np.matmul(dy, self.q.T, out=out)


REFLECTORS = 2  # Householder reflectors per O(d) orthogonal layer


class Householder(Layer):
    """A fixed orthogonal map y = x Q stored and applied in O(d): Q = H₁⋯H_r.

    H_j = I − 2 u_j u_jᵀ/‖u_j‖², u_j ~ N(0, I_d) from the block's seed, r = REFLECTORS.
    Each H_j is symmetric and H_j² = I, so Q is orthogonal (QᵀQ = H_r⋯H₁H₁⋯H_r = I)
    and ‖xQ‖ = ‖x‖; applying it costs r dot products and r axpys per row (4rd flops)
    and storing it r·d numbers, where a dense Haar layer (``Orthogonal``) costs d² of
    each.

    Why reflectors (not a signed permutation times a fast transform): a dense Haar
    layer is itself H₁⋯H_d·diag(±1) (its QR factorisation), so this layer is the
    same construction cut to r reflectors; it exists for every d (no power of two),
    its backward is the same product in reverse, and a chain of them composes
    blockwise into BLAS-3 products (``model.reflectors``) for the fused evaluation.

    Mixing: one reflector sends e_i to e_i − 2u_i u/‖u‖², whose coordinates are all
    non-zero with probability 1 (u Gaussian), so every output coordinate depends on
    every input coordinate; with r = 2 the off-diagonal entry (i, j) of Q is a
    non-zero polynomial in the Gaussian u's, non-zero with probability 1. r = 2 also
    makes det Q = +1 (a rotation, not a reflection).
    """

    name = "householder"

    def __init__(self, u: Array):
        if u.ndim != 2 or u.shape[0] < 1:
            raise ValueError(f"householder: need (reflectors, n) vectors, got {u.shape}")
        self.u = u
        self.scale = 2.0 / np.einsum("ij,ij->i", u, u)  # 2/‖u_j‖²
        self.n_in = self.n_out = u.shape[1]

    @classmethod
    def init(
        cls, rng: np.random.Generator, n: int, reflectors: int = REFLECTORS, dtype=np.float64
    ) -> Householder:
        """r Gaussian reflector vectors u_j, normalised to ‖u_j‖ = 1."""
        u = rng.standard_normal((reflectors, n))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        return cls(u.astype(dtype))

    def _apply(self, x: Array, order) -> Array:
        y = np.array(x, dtype=np.float64, copy=True)
        for j in order:
            u = self.u[j]
            y -= np.outer(self.scale[j] * (y @ u), u)
        return y

    def forward(self, x, params):
        """y = x H₁⋯H_r: reflect by H₁ first (row vectors)."""
        return self._apply(x, range(len(self.u))), None

    def backward(self, dy, cache, params, grads):
        """dL/dx = dy Qᵀ = dy H_r⋯H₁."""
        return self._apply(dy, range(len(self.u) - 1, -1, -1))

    def matrix(self) -> Array:
        """The dense Q (d×d): for tests and small checks only."""
        return self._apply(np.eye(self.n_in), range(len(self.u)))


ORTHOGONAL_LAYERS = (Orthogonal, Householder)


class Identity(Layer):
    """y = x (flatten is the identity on the (rows, features) layout used here)."""

    name = "identity"

    def __init__(self, n: int):
        self.n_in = self.n_out = n

    def forward(self, x, params):
        return x, None

    def backward(self, dy, cache, params, grads):
        return dy


def forward_layers(
    layers: Sequence[Layer], x: Array, params: Sequence[Sequence[Array]]
) -> tuple[Array, list[Any]]:
    """Run a list of layers; return the output and the per-layer caches."""
    caches = []
    for layer, p in zip(layers, params):
        x, c = layer.forward(x, p)
        caches.append(c)
    return x, caches


def forward_layers_into(
    layers: Sequence[Layer], x: Array, params: Sequence[Sequence[Array]], out: Array
) -> list[Any]:
    """``forward_layers`` with the last layer's output written into ``out``; the caches."""
    if not layers:
        np.copyto(out, x)
        return []
    caches = []
    for layer, p in zip(layers[:-1], params):
        x, c = layer.forward(x, p)
        caches.append(c)
    caches.append(layers[-1].forward_into(x, params[len(layers) - 1], out))
    return caches


def _backward_to_first(layers, dy, caches, params, grads) -> Array:
    """Backpropagate through layers L-1..1 (accumulating grads); dL/d(output of layer 0)."""
    for idx in range(len(layers) - 1, 0, -1):
        g = grads[idx] if grads is not None else None
        dy = layers[idx].backward(dy, caches[idx], params[idx], g)
    return dy


def backward_layers(
    layers: Sequence[Layer],
    dy: Array,
    caches: Sequence[Any],
    params: Sequence[Sequence[Array]],
    grads: Sequence[Sequence[Array]] | None,
    need_dx: bool = True,
) -> Array | None:
    """Backpropagate through a list of layers (in reverse), accumulating grads.

    With ``need_dx`` False (the first stage when the input is not a variable)
    dL/dx of the first layer is not wanted: a layer with a ``backward_params``
    method then only accumulates its parameter gradients, and None is returned.
    """
    if not layers:
        return dy
    dy = _backward_to_first(layers, dy, caches, params, grads)
    g = grads[0] if grads is not None else None
    if not need_dx:
        layers[0].backward_into(dy, caches[0], params[0], g, None)
        return None
    return layers[0].backward(dy, caches[0], params[0], g)


def backward_layers_into(
    layers: Sequence[Layer],
    dy: Array,
    caches: Sequence[Any],
    params: Sequence[Sequence[Array]],
    grads: Sequence[Sequence[Array]] | None,
    out: Array | None,
) -> None:
    """``backward_layers`` with dL/dx written into ``out`` (None: dL/dx not wanted)."""
    if not layers:
        if out is not None:
            np.copyto(out, dy)
        return
    dy = _backward_to_first(layers, dy, caches, params, grads)
    layers[0].backward_into(dy, caches[0], params[0], grads[0] if grads is not None else None, out)
