"""Test problems: convex chains with known optima, the digits attack, few-shot.

Each problem gives the model (blocks + head), the data, which variable is
optimised, and what the bounds need: f*, L (Lipschitz) or β (smoothness),
R = ‖θ₀ − θ*‖ and the dimension d of θ. The convex chains put the variable
at the input (θ = δ, x = 0, m = 1) and pass it through Δ fixed orthogonal
layers Q = Q₁⋯Q_Δ, which keep norms, so f(θ) = g(θQ) has the L, β, R and f*
of g (θ* = z*Qᵀ).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpcpipe.model import rng
from hpcpipe.model.layers import forward_layers
from hpcpipe.model.stages import Batch, ModelSpec, Stage

PROBLEMS = ("l1-chain", "max-chain", "quad-chain", "attack", "fewshot")


@dataclass
class Problem:
    """What the optimizer needs to know about f."""

    name: str
    spec: ModelSpec
    batch: Batch
    variable: str
    dim: int
    f_star: float | None = None
    L: float | None = None
    beta: float | None = None
    R: float | None = None
    mu: float = 0.0  # variable-side quadratic μ/2‖θ‖² (max-chain)
    weights: np.ndarray | None = None  # full weight vector replacing the seeded init
    box: tuple[np.ndarray, np.ndarray] | None = None  # θ ∈ [lo, hi] (input variable)
    z_star: np.ndarray | None = None  # minimiser seen after the chain: θ* = z*Qᵀ
    info: dict = field(default_factory=dict)

    @property
    def theta_star(self) -> np.ndarray | None:
        """θ* = z*Qᵀ, built on demand: it needs every layer, which no rank holds in a run."""
        if self.z_star is None:
            return None
        return (self.z_star @ chain_map(self.spec).T).ravel()

    def project(self, theta: np.ndarray) -> np.ndarray:
        """Euclidean projection on the box (ℓ∞ ball ∩ valid inputs): a clip, exact."""
        if self.box is None or theta.size == 0:
            return theta
        return np.clip(theta, self.box[0], self.box[1])


def _orth_spec(depth: int, d: int, head: str, seed: int, **head_args) -> ModelSpec:
    return ModelSpec(
        "orthogonal", depth=depth, d_in=d, d_out=d, head=head, head_args=head_args, seed=seed
    )


def chain_map(spec: ModelSpec) -> np.ndarray:
    """Q = Q₁⋯Q_Δ of an orthogonal chain (row-vector convention: z = θQ)."""
    q = np.eye(spec.d_in)
    for b in range(spec.depth):
        q = q @ spec.block(b)[0].q
    return q


def l1_chain(depth: int, d: int, seed: int, radius: float = 1.0) -> Problem:
    """f(θ) = (1/√d)‖θQ − b‖₁: non-smooth convex, L = 1, f* = 0, θ* = bQᵀ, R = ‖b‖."""
    spec = _orth_spec(depth, d, "abs", seed)
    b = rng.data_generator(seed, 1).standard_normal((1, d))
    b *= radius / np.linalg.norm(b)
    return Problem(
        "l1-chain",
        spec,
        Batch(np.zeros((1, d)), b),
        "input",
        d,
        f_star=0.0,
        L=1.0,
        R=float(np.linalg.norm(b)),  # Q is orthogonal: ‖θ*‖ = ‖bQᵀ‖ = ‖b‖
        z_star=b,
    )


def max_chain(depth: int, d: int, seed: int, mu: float | None = None) -> Problem:
    """f(θ) = max_j (θQ)_j + (μ/2)‖θ‖² (Nesterov 2004, §3.2.1, with k = d).

    Minimiser z*_j = −1/(μd) for all j, f* = −1/(2μd); θ* = z*Qᵀ, R = ‖θ*‖ =
    1/(μ√d) from θ₀ = 0. Lipschitz on the ball ‖θ‖ ≤ 2R: L = 1 + 2μR. The
    default μ = 1/√d makes R = 1 whatever d.
    """
    mu = 1.0 / np.sqrt(d) if mu is None else mu
    spec = _orth_spec(depth, d, "max", seed)
    z_star = np.full((1, d), -1.0 / (mu * d))
    R = float(np.linalg.norm(z_star))  # ‖θ*‖ = ‖z*Qᵀ‖ = ‖z*‖
    return Problem(
        "max-chain",
        spec,
        Batch(np.zeros((1, d)), np.zeros((1, d))),
        "input",
        d,
        f_star=-1.0 / (2 * mu * d),
        L=1.0 + 2 * mu * R,
        R=R,
        mu=mu,
        z_star=z_star,
    )


def quad_chain(
    depth: int, d: int, seed: int, beta: float = 1.0, lambda_min: float = 1e-9
) -> Problem:
    """A β-smooth convex quadratic through the chain, where the O(1/T²) and O(1/T) rates show.

    f(θ) = ½ Σ_j λ_j ((θQ)_j − b_j)², λ_j log-uniform in [λ_min, β], b_j = 1/√d
    (R = ‖b‖ = 1, θ* = bQᵀ, f* = 0). With η = 1/β, GD's gap is
    ½ Σ λ_j (1 − λ_j/β)^{2T} b_j² ≈ ∫ e^{−2Tλ} dλ/(2 log(β/λ_min)) ∝ 1/T, and
    AGD's ∝ 1/T², while T ≪ 1/√λ_min (the problem then looks merely convex).
    """
    lambdas = beta * (lambda_min / beta) ** (np.arange(d) / max(d - 1, 1))
    spec = _orth_spec(depth, d, "squared", seed, lambdas=tuple(lambdas))
    b = np.full((1, d), 1.0 / np.sqrt(d))
    return Problem(
        "quad-chain",
        spec,
        Batch(np.zeros((1, d)), b),
        "input",
        d,
        f_star=0.0,
        beta=beta,
        R=float(np.linalg.norm(b)),  # ‖θ*‖ = ‖bQᵀ‖ = ‖b‖
        z_star=b,
    )


# ---------------------------------------------------------------- digits


def load_digits_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (no download), pixels in [0, 1], 1400/397 split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover
        raise RuntimeError("the digits problems need scikit-learn: pip install scikit-learn") from e
    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    perm = rng.data_generator(seed, 7).permutation(len(y))
    tr, te = perm[:1400], perm[1400:]
    return x[tr], y[tr], x[te], y[te]


def _mlp_spec(depth: int, width: int, seed: int, head: str) -> ModelSpec:
    return ModelSpec("mlp", depth=depth, d_in=64, d_out=10, width=width, head=head, seed=seed)


def logits(spec: ModelSpec, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Forward pass of the whole model in one process (for accuracy checks)."""
    st = Stage(spec, 0, spec.depth)
    y, _ = forward_layers(st.layers, x, st.views(weights))
    return y


def cache_dir() -> Path:
    return Path(os.environ.get("HPCPIPE_CACHE", Path.home() / ".cache" / "hpcpipe"))


def train_classifier(
    comm,
    depth: int,
    width: int,
    seed: int,
    iterations: int = 300,
    lr: float = 0.1,
    momentum: float = 0.9,
) -> tuple[np.ndarray, float]:
    """Train the digits MLP through the pipeline (weights are the variable).

    Full-batch heavy-ball on softmax cross-entropy, every stage updating only
    its own weights; deterministic from the seed. Returns (weights, test
    accuracy) on every rank. Cached under HPCPIPE_CACHE (default
    ~/.cache/hpcpipe), keyed by every setting that changes the result.
    """
    from hpcpipe.model.stages import stage_offsets
    from hpcpipe.pipeline.engine import Engine

    key = hashlib.sha256(repr((depth, width, seed, iterations, lr, momentum, 2)).encode())
    path = cache_dir() / f"digits-mlp-{key.hexdigest()[:16]}.npz"
    spec = _mlp_spec(depth, width, seed, "cross_entropy")
    xtr, ytr, xte, yte = load_digits_split(seed)
    found = comm.bcast(path.exists() if comm.rank == 0 else None, root=0)
    if found:
        data = np.load(path) if comm.rank == 0 else None
        w = comm.bcast(data["weights"] if data is not None else None, root=0)
        return w, float(comm.bcast(float(data["accuracy"]) if data is not None else None, root=0))
    eng = Engine(
        comm,
        spec,
        Batch(xtr, ytr),
        "weights",
        "gpipe",
        samples=1,
        microbatches=min(4, depth * 2),
        seed=seed,
        clock="model",
    )
    theta = eng.initial_point()
    vel = np.zeros_like(theta)
    for _ in range(iterations):
        res = eng.evaluate(theta)
        vel = momentum * vel - lr * res.grad
        theta = theta + vel
    eng.close()
    parts = comm.allgather(theta)
    w = np.concatenate(parts)
    assert w.size == stage_offsets(spec, comm.size)[-1]
    acc = float((logits(spec, w, xte).argmax(1) == yte).mean())
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(tmp, weights=w, accuracy=acc)
        os.replace(tmp, path)
    return w, acc


def attack(
    comm, depth: int, width: int, m: int, seed: int, radius: float = 0.1, head: str = "margin"
) -> Problem:
    """ℓ∞ attack on m correctly classified test digits: minimise the CW margin.

    θ = δ (m, 64) on stage 0, constrained to ‖δ‖∞ ≤ radius and x + δ ∈ [0, 1]:
    the box [max(−r, −x), min(r, 1 − x)], whose projection is a clip. An
    image is misclassified (attack success) when its margin is < 0.
    """
    w, acc = train_classifier(comm, depth, width, seed)
    spec = _mlp_spec(depth, width, seed, head)
    _, _, xte, yte = load_digits_split(seed)
    ok = np.flatnonzero(logits(spec, w, xte).argmax(1) == yte)
    pick = rng.data_generator(seed, 8).choice(ok, size=m, replace=False)
    x, y = xte[pick], yte[pick]
    lo = np.maximum(-radius, -x).ravel()
    hi = np.minimum(radius, 1.0 - x).ravel()
    return Problem(
        "attack",
        spec,
        Batch(x, y),
        "input",
        x.size,
        weights=w,
        box=(lo, hi),
        info={"classifier_test_accuracy": acc, "radius": radius, "images": m},
    )


def fewshot(depth: int, width: int, m: int, seed: int) -> Problem:
    """Train the digits MLP on m <= 20 training examples (weights are the variable)."""
    if not 1 <= m <= 20:
        raise ValueError(f"fewshot: m must be between 1 and 20, got {m}")
    xtr, ytr, _, _ = load_digits_split(seed)
    spec = _mlp_spec(depth, width, seed, "cross_entropy")
    return Problem(
        "fewshot",
        spec,
        Batch(xtr[:m], ytr[:m]),
        "weights",
        sum(spec.block_size(b) for b in range(depth)),
    )
