"""Convex chains with known optima: l1-chain, max-chain, quad-chain.

The variable is the input (θ = δ, x = 0, m = 1), passed through Δ fixed
orthogonal layers Q = Q₁⋯Q_Δ, which keep norms, so f(θ) = g(θQ) has the L,
β, R and f* of the head g (θ* = z*Qᵀ).

The setting ``layers`` chooses the blocks: ``dense`` (a Haar-random d×d matrix
each, Δd² memory) or ``householder`` (``layers.Householder``: r seeded reflectors
each, Δrd memory). Every constant above, and every lower-bound argument of
``problems.worstcase``, uses only QᵀQ = I, so both give the same problem; GD, AGD
and PPRS with isotropic Gaussian noise are equivariant under θ ↦ θQ, so their
iteration counts have the same distribution under either layer type.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from hpcpipe.errors import need
from hpcpipe.model import rng
from hpcpipe.model.stages import Batch, ModelSpec
from hpcpipe.problems.base import L2Regulariser, Problem, ProblemEntry, need_single_example


def exact_norm(v: np.ndarray) -> float:
    """‖v‖ with its squares summed exactly (``math.fsum``) and one rounding at the root:
    the same bits on every CPU, where ``np.linalg.norm``'s summation order follows the
    SIMD width (0.9999999999999998 for a norm of 1 on an AVX-512 machine). A problem's
    constants (R, and L through it) set the plan's T, K, γ and η."""
    return math.sqrt(math.fsum(np.square(np.asarray(v, dtype=np.float64)).ravel()))


@dataclass
class ChainProblem(Problem):
    """A chain problem, with the minimiser z* seen after the chain: θ* = z*Qᵀ."""

    z_star: np.ndarray | None = None

    @property
    def theta_star(self) -> np.ndarray | None:
        """θ* = z*Qᵀ, built on demand: it needs every layer, which no rank holds in a run."""
        if self.z_star is None:
            return None
        return (self.z_star @ chain_map(self.spec).T).ravel()


def _orth_spec(depth: int, d: int, head: str, seed: int, **head_args) -> ModelSpec:
    return ModelSpec(
        "orthogonal", depth=depth, d_in=d, d_out=d, head=head, head_args=head_args, seed=seed
    )


LAYER_KINDS = {"dense": "orthogonal", "householder": "householder"}  # setting -> ModelSpec kind


def chain_map(spec: ModelSpec) -> np.ndarray:
    """Q = Q₁⋯Q_Δ of an orthogonal chain (row-vector convention: z = θQ), either layer type."""
    q = np.eye(spec.d_in)
    for b in range(spec.depth):
        q, _ = spec.block(b)[0].forward(q, [])
    return q


def with_layers(problem: ChainProblem, layers: str) -> ChainProblem:
    """The same chain problem on the layer type ``layers`` (``LAYER_KINDS``)."""
    if layers not in LAYER_KINDS:
        raise ValueError(f"layers {layers!r}: choose one of {', '.join(LAYER_KINDS)}")
    problem.spec = dataclasses.replace(problem.spec, kind=LAYER_KINDS[layers])
    return problem


def l1_chain(depth: int, d: int, seed: int, radius: float = 1.0) -> ChainProblem:
    """f(θ) = (1/√d)‖θQ − b‖₁: non-smooth convex, L = 1, f* = 0, θ* = bQᵀ, R = ‖b‖."""
    b = rng.data_generator(seed, 1).standard_normal((1, d))
    b *= radius / np.linalg.norm(b)
    return _residual_chain("l1-chain", _orth_spec(depth, d, "abs", seed), b, L=1.0)


def max_chain(depth: int, d: int, seed: int, mu: float | None = None) -> ChainProblem:
    """f(θ) = max_j (θQ)_j + (μ/2)‖θ‖² (Nesterov 2004, §3.2.1, with k = d).

    Minimiser z*_j = −1/(μd) for all j, f* = −1/(2μd); θ* = z*Qᵀ, R = ‖θ*‖ =
    1/(μ√d) from θ₀ = 0. Lipschitz on the ball ‖θ‖ ≤ 2R: L = 1 + 2μR. The
    default μ = 1/√d makes R = 1 whatever d. The quadratic term is the
    problem's regulariser, added to the pipeline's max head.
    """
    mu = 1.0 / np.sqrt(d) if mu is None else mu
    spec = _orth_spec(depth, d, "max", seed)
    z_star = np.full((1, d), -1.0 / (mu * d))
    R = exact_norm(z_star)  # ‖θ*‖ = ‖z*Qᵀ‖ = ‖z*‖
    return ChainProblem(
        "max-chain",
        spec,
        Batch(np.zeros((1, d)), np.zeros((1, d))),
        "input",
        d,
        f_star=-1.0 / (2 * mu * d),
        L=1.0 + 2 * mu * R,
        R=R,
        regulariser=L2Regulariser(mu),
        z_star=z_star,
    )


def quad_chain(
    depth: int, d: int, seed: int, beta: float = 1.0, lambda_min: float = 1e-9
) -> ChainProblem:
    """A β-smooth convex quadratic through the chain, where the O(1/T²) and O(1/T) rates show.

    f(θ) = ½ Σ_j λ_j ((θQ)_j − b_j)², λ_j log-uniform in [λ_min, β], b_j = 1/√d
    (R = ‖b‖ = 1, θ* = bQᵀ, f* = 0). With η = 1/β, GD's gap is
    ½ Σ λ_j (1 − λ_j/β)^{2T} b_j² ≈ ∫ e^{−2Tλ} dλ/(2 log(β/λ_min)) ∝ 1/T, and
    AGD's ∝ 1/T², while T ≪ 1/√λ_min (the problem then looks merely convex).
    """
    lambdas = beta * (lambda_min / beta) ** (np.arange(d) / max(d - 1, 1))
    spec = _orth_spec(depth, d, "squared", seed, lambdas=tuple(lambdas))
    return _residual_chain("quad-chain", spec, np.full((1, d), 1.0 / np.sqrt(d)), beta=beta)


def _residual_chain(name: str, spec: ModelSpec, b: np.ndarray, **constant) -> ChainProblem:
    """g(z) = ℓ(z − b) ≥ 0 with ℓ(0) = 0: z* = b, f* = 0, θ* = bQᵀ and, Q being
    orthogonal, R = ‖θ*‖ = ‖b‖ from θ₀ = 0."""
    d = spec.d_in
    return ChainProblem(
        name,
        spec,
        Batch(np.zeros((1, d)), b),
        "input",
        d,
        f_star=0.0,
        R=exact_norm(b),
        z_star=b,
        **constant,
    )


def _entry(name: str, make, about: str, check=None) -> ProblemEntry:
    """A chain's registry entry: built from depth, dim and seed; one example; theory-ready."""
    return ProblemEntry(
        lambda cfg, comm: with_layers(make(cfg.depth, cfg.dim, cfg.seed), cfg.layers),
        check or need_single_example(name),
        theory=True,
        about=about,
    )


def smooth_check(name: str):
    """The check of a β-smooth chain with no Lipschitz constant L: theory mode plans GD or
    AGD (theory_plan's smooth rules); PPRS's rule needs L."""

    def check(cfg) -> None:
        need_single_example(name)(cfg)
        need(
            not (cfg.mode == "theory" and cfg.optimizer == "pprs"),
            "optimizer",
            cfg.optimizer,
            f"theory mode on {name} (smooth: beta and R known, no L) plans gd or agd only",
        )

    return check


ENTRIES = {
    "l1-chain": _entry("l1-chain", l1_chain, "(1/√d)‖θQ − b‖₁: non-smooth, L = 1, f* = 0"),
    "max-chain": _entry("max-chain", max_chain, "max_j (θQ)_j + (μ/2)‖θ‖²: non-smooth, known f*"),
    "quad-chain": _entry(
        "quad-chain",
        quad_chain,
        "ill-conditioned quadratic: β-smooth, f* = 0",
        smooth_check("quad-chain"),
    ),
}
