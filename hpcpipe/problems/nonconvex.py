"""A smooth non-convex hard instance: zero-chain (Carmon, Duchi, Hinder, Sidford 2020).

f(θ) = f̄_T(θQ) with f̄_T the ``zero-chain`` head (``hpcpipe.model.losses.ZeroChain``)
over T = d coordinates, through the fixed orthogonal chain Q = Q₁⋯Q_Δ (θ = δ at
the input, x = 0, m = 1). Q keeps norms, so ‖∇f(θ)‖ = ‖∇f̄_T(θQ)‖ and f has the
constants of f̄_T.

Smoothness, β = 152. With 0 ≤ Ψ ≤ e, 0 ≤ Ψ' ≤ √(54/e), |Ψ''| ≤ 32.5, 0 ≤ Φ ≤ √(2πe),
0 ≤ Φ' ≤ √e, |Φ''| ≤ 1 (Carmon et al. 2020, Lemma 1; checked on a grid in the
tests), the Hessian of f̄_T is tridiagonal with, in row j, a diagonal entry of
size ≤ e·1 + 32.5·√(2πe) (only one of Ψ(±z) is non-zero) and two off-diagonal
entries of size ≤ √(54/e)·√e = √54. Gershgorin: ‖∇²f̄_T‖ ≤ e + 32.5√(2πe) + 2√54
= 151.7 ≤ 152 (their Lemma 3: ℓ₁ ≤ 152).

Values. f̄_T(0) = −Ψ(1)Φ(0) = −√(2πe)/2 (Ψ(0) = 0). Each link term is
> −e·√(2πe) (Ψ(z_{i−1})Φ(z_i) < e·√(2πe), and Ψ(−·)Φ(−·) ≥ 0), the first is
> −√(2πe), and both bounds are approached as every z_i → +∞, so

    f* = inf f = −√(2πe)·(1 + e(T − 1))   (not attained),
    f(θ₀) − f* = √(2πe)·(1/2 + e(T − 1)) ≤ 12T   (θ₀ = 0; their Lemma 3).

Lower bound (their Lemma 3 and Observation 2). ∂f̄_T/∂z_{j+1} = 0 while
|z_j| ≤ 1/2, so from θ₀ = 0 a method whose iterates lie in the span of the
gradients it saw has z_T = 0 after t < T oracle calls, and ‖∇f̄_T(z)‖ > 1
whenever |z_T| < 1. So for ε ≤ 1 the first point with ‖∇f‖ ≤ ε is θ_T or
later, whose gradient is the answer to call T + 1.

Upper bound (Nesterov 2004, §1.2.3, from the descent lemma f(θ − ∇f/β) ≤
f(θ) − ‖∇f(θ)‖²/(2β)): GD with η = 1/β has min_{t<N} ‖∇f(θ_t)‖² ≤ 2β(f(θ₀) − f*)/N,
so some θ_t, t < N_ub = ⌈2β(f(θ₀) − f*)/ε²⌉, has ‖∇f(θ_t)‖ ≤ ε.
"""

from __future__ import annotations

import math

import numpy as np

from hpcpipe.errors import need
from hpcpipe.model.stages import Batch
from hpcpipe.problems.base import ProblemEntry, need_single_example
from hpcpipe.problems.chains import ChainProblem, _orth_spec, with_layers

BETA = 152.0
ROOT = math.sqrt(2.0 * math.pi * math.e)  # Φ(+∞) = √(2πe)


def zero_chain_inf(T: int) -> float:
    """f* = inf f̄_T = −√(2πe)(1 + e(T − 1)) (see the module docstring)."""
    return -ROOT * (1.0 + math.e * (T - 1))


def zero_chain_gap0(T: int) -> float:
    """f(θ₀) − f* = √(2πe)(1/2 + e(T − 1)) from θ₀ = 0."""
    return ROOT * (0.5 + math.e * (T - 1))


def gd_calls(T: int, eps: float, beta: float = BETA) -> int:
    """N_ub = ⌈2β(f(θ₀) − f*)/ε²⌉: GD at η = 1/β meets ‖∇f(θ_t)‖ ≤ ε at some t < N_ub."""
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    return math.ceil(2.0 * beta * zero_chain_gap0(T) / (eps * eps))


def zero_chain(depth: int, d: int, seed: int) -> ChainProblem:
    """f(θ) = f̄_d(θQ): smooth (β = 152), non-convex, f* = −√(2πe)(1 + e(d − 1))."""
    return ChainProblem(
        "zero-chain",
        _orth_spec(depth, d, "zero-chain", seed),
        Batch(np.zeros((1, d)), np.zeros((1, d))),
        "input",
        d,
        f_star=zero_chain_inf(d),
        beta=BETA,
        info={"chain_length": d, "initial_gap": zero_chain_gap0(d)},
    )


def _check(cfg) -> None:
    need_single_example("zero-chain")(cfg)
    need(
        cfg.mode != "theory",
        "mode",
        cfg.mode,
        "zero-chain is non-convex: theory mode's rules are for convex problems; "
        "use mode = 'practical' with lr = 1/152 (GD at 1/beta)",
    )


ENTRIES = {
    "zero-chain": ProblemEntry(
        lambda cfg, comm: with_layers(zero_chain(cfg.depth, cfg.dim, cfg.seed), cfg.layers),
        _check,
        theory=False,
        about="Carmon et al.'s non-convex chain: β = 152, span methods need d steps to ‖∇f‖ ≤ 1",
    ),
}
