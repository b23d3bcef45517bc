"""Depth-Δ models split into contiguous stages, and the stage that owns a block.

A model is Δ *blocks* (the paper's layers; a block is one or more primitive
layers, e.g. dense + ReLU) followed by a loss head. Block b is built from its
own random stream (``rng.init_generator(seed, b)``), so a rank can build only
its own blocks and the numbers never depend on the partition.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from hpcpipe.model import rng
from hpcpipe.model.layers import Dense, Householder, Layer, Orthogonal, ReLU
from hpcpipe.model.losses import LossHead, make_head
from hpcpipe.model.reflectors import block_vectors

Array = np.ndarray

VARIABLES = ("input", "weights")
KINDS = ("mlp", "dense", "orthogonal", "householder")
CHAIN_KINDS = ("orthogonal", "householder")  # fixed orthogonal blocks, d_in = d_out


class PartitionError(ValueError):
    """The depth does not fit the number of stages."""


def partition(depth: int, n_stages: int) -> list[tuple[int, int]]:
    """Split blocks 0..depth-1 into n_stages contiguous ranges [lo, hi).

    Balanced: sizes differ by at most one, the larger ranges first (like
    numpy.array_split).
    """
    if n_stages < 1:
        raise PartitionError(f"number of stages must be >= 1, got {n_stages}")
    if depth < n_stages:
        raise PartitionError(
            f"depth {depth} is smaller than the number of stages (MPI ranks) {n_stages}: "
            f"every rank needs at least one layer; use at most {depth} ranks or depth >= {n_stages}"
        )
    return balanced_split(depth, n_stages)


def balanced_split(total: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of ``parts`` contiguous pieces of ``total``; sizes differ by <= 1,
    the larger first (like numpy.array_split)."""
    q, r = divmod(total, parts)
    out, lo = [], 0
    for j in range(parts):
        hi = lo + q + (1 if j < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


class Model:
    """What a pipeline runs: Δ blocks of layers and a loss head, built block by block.

    The surface the stages, the engine and the reference use. ``block(b)``
    must build block b from its own random stream (``rng.init_generator(seed,
    b)``) and nothing else, so that a rank builds only the blocks it owns and
    the numbers do not depend on the partition; ``block_size(b)`` counts its
    trainable parameters without building it. Subclass it for a model of
    your own layers (docs/extending.md); ``ModelSpec`` is the built-in one.
    """

    depth: int
    d_in: int
    d_out: int
    seed: int

    def dims(self) -> list[int]:
        """Feature sizes n_0..n_Δ between blocks (n_0 = d_in, n_Δ = d_out)."""
        raise NotImplementedError

    def block(self, b: int) -> list[Layer]:
        """The layers of block b, built from ``rng.init_generator(self.seed, b)``."""
        raise NotImplementedError

    def block_size(self, b: int) -> int:
        """Number of trainable parameters of block b (without building it)."""
        raise NotImplementedError

    def make_head(self) -> LossHead:
        """The loss head ℓ(z, y) applied to the last block's output."""
        raise NotImplementedError


@dataclass(frozen=True)
class ModelSpec(Model):
    """What to build: the architecture, its sizes and its seed.

    kind ``mlp``: block b is Dense(n_b -> n_{b+1}) followed by ReLU, except
    the last block (no ReLU); n_0 = d_in, n_1..n_{Δ-1} = width, n_Δ = d_out.
    kind ``orthogonal``: every block is a fixed Haar-random orthogonal map of
    size d_in (= width = d_out); no trainable weights.
    kind ``householder``: the same chain with O(d) blocks, each a fixed product of
    ``layers.REFLECTORS`` seeded Householder reflectors (``layers.Householder``).
    kind ``dense``: like ``mlp`` without ReLUs (a linear network).
    """

    kind: str
    depth: int
    d_in: int
    d_out: int
    width: int = 0
    head: str = "squared"
    head_args: dict = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"model kind {self.kind!r}: choose {', '.join(KINDS)}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.kind in CHAIN_KINDS and self.d_in != self.d_out:
            raise ValueError("an orthogonal chain needs d_in == d_out")

    def dims(self) -> list[int]:
        """Feature sizes n_0..n_Δ between blocks."""
        if self.kind in CHAIN_KINDS:
            return [self.d_in] * (self.depth + 1)
        w = self.width or self.d_in
        return [self.d_in] + [w] * (self.depth - 1) + [self.d_out]

    def block(self, b: int) -> list[Layer]:
        """Build block b from its own random stream."""
        n = self.dims()
        if self.kind == "orthogonal":
            return [Orthogonal(_orthogonal_matrix(self.seed, b, n[b]))]
        if self.kind == "householder":
            return [Householder(block_vectors(self.seed, b, n[b]))]
        g = rng.init_generator(self.seed, b)
        layers: list[Layer] = [Dense.init(g, n[b], n[b + 1])]
        if self.kind == "mlp" and b < self.depth - 1:
            layers.append(ReLU(n[b + 1]))
        return layers

    def block_size(self, b: int) -> int:
        """Number of trainable parameters of block b (without building it)."""
        if self.kind in CHAIN_KINDS:
            return 0
        n = self.dims()
        return n[b] * n[b + 1] + n[b + 1]

    def make_head(self) -> LossHead:
        return make_head(self.head, **self.head_args)


@functools.lru_cache(maxsize=16)
def _orthogonal_matrix(seed: int, b: int, n: int) -> Array:
    """Block b's fixed orthogonal matrix, read-only and built once per process.

    A run builds its stage twice (the oracle engine and the exact-f engine);
    at d = 4096 each QR costs about 7 s on one core, so the fixed, untrained
    matrices are cached (weights of dense blocks are not: they get trained).
    The runner clears the cache once its engines exist (``clear_block_cache``),
    so a sweep of many points in one process does not keep their matrices.
    """
    q = Orthogonal.init(rng.init_generator(seed, b), n).q
    q.flags.writeable = False
    return q


def clear_block_cache() -> None:
    """Drop the cached orthogonal matrices (the stages that use them keep theirs)."""
    _orthogonal_matrix.cache_clear()


class Stage:
    """Blocks [lo, hi) of a model: layers, parameters and their flat views.

    ``flat`` is one contiguous float64 vector holding all the stage's trainable
    parameters; each layer's parameters are views into it, so optimizers work
    on flat local vectors and the engine evaluates at any point of the same
    layout.
    """

    def __init__(self, spec: Model, lo: int, hi: int, index: int = 0, n_stages: int = 1):
        self.spec, self.lo, self.hi = spec, lo, hi
        self.index, self.n_stages = index, n_stages
        self.layers: list[Layer] = []
        self.param_ids: list[list[int]] = []
        for b in range(lo, hi):
            block = spec.block(b)
            k = 0
            for layer in block:
                ids = []
                for _ in layer.params():
                    ids.append(rng.param_id(b, k))
                    k += 1
                self.layers.append(layer)
                self.param_ids.append(ids)
        self.shapes = [[p.shape for p in layer.params()] for layer in self.layers]
        # (start, end, shape) of each parameter in the flat layout, per layer
        self._spans: list[list[tuple[int, int, tuple]]] = []
        off = 0
        for shapes in self.shapes:
            spans = []
            for s in shapes:
                n = int(np.prod(s))
                spans.append((off, off + n, s))
                off += n
            self._spans.append(spans)
        self.size = off
        self.flat = np.empty(self.size)
        views = self.views(self.flat)
        for layer, vs in zip(self.layers, views):
            for p, v in zip(layer.params(), vs):
                v[...] = p
        self.head = spec.make_head() if self.is_last else None
        self.n_in = spec.dims()[lo]
        self.n_out = spec.dims()[hi]

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.n_stages - 1

    def views(self, vec: Array) -> list[list[Array]]:
        """Per-layer parameter views of a flat vector of this stage's layout."""
        if vec.shape != (self.size,):
            raise ValueError(f"stage vector has shape {vec.shape}, expected ({self.size},)")
        return [[vec[a:b].reshape(s) for a, b, s in spans] for spans in self._spans]

    def perturbed(self, point: Array, gamma: float, seed: int, call: int, sample: int) -> Array:
        """point + γ·Z(seed, call, parameter, sample), parameter by parameter."""
        if gamma == 0.0 or self.size == 0:
            return point
        out = np.empty_like(point)
        ov, pv = self.views(out), self.views(point)
        for ids, o_l, p_l in zip(self.param_ids, ov, pv):
            for pid, o, p in zip(ids, o_l, p_l):
                o[...] = p + gamma * rng.noise(seed, call, pid, sample, p.shape)
        return out


def stage_offsets(spec: Model, n_stages: int) -> list[int]:
    """Offsets of each stage's flat weights in the global weight vector (n_stages + 1)."""
    offs = [0]
    for lo, hi in partition(spec.depth, n_stages):
        offs.append(offs[-1] + sum(spec.block_size(b) for b in range(lo, hi)))
    return offs


def build_stages(spec: Model, n_stages: int) -> list[Stage]:
    """All stages of a model (the single-process reference builds them all)."""
    return [
        Stage(spec, lo, hi, s, n_stages)
        for s, (lo, hi) in enumerate(partition(spec.depth, n_stages))
    ]


@dataclass
class Batch:
    """m examples: inputs x (m, d_in) and targets (int labels (m,) or floats (m, d_out))."""

    x: Array
    targets: Array

    @property
    def m(self) -> int:
        return self.x.shape[0]


def microbatch_bounds(m: int, n_micro: int) -> list[tuple[int, int]]:
    """Row ranges of n_micro contiguous microbatches of m examples (balanced)."""
    if not 1 <= n_micro <= m:
        raise ValueError(f"microbatches must be between 1 and m={m}, got {n_micro}")
    return balanced_split(m, n_micro)


def random_batch(spec: ModelSpec, m: int, seed: int = 0) -> Batch:
    """Synthetic data for tests: Gaussian inputs; labels or float targets by head."""
    g = rng.data_generator(seed)
    x = g.standard_normal((m, spec.d_in))
    if spec.head in ("cross_entropy", "margin"):
        t = g.integers(0, spec.d_out, size=m)
    else:
        t = g.standard_normal((m, spec.d_out))
    return Batch(x, t)


__all__ = [
    "Batch",
    "Model",
    "ModelSpec",
    "PartitionError",
    "Stage",
    "VARIABLES",
    "build_stages",
    "microbatch_bounds",
    "partition",
    "random_batch",
    "stage_offsets",
]
