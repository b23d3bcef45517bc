"""Hard instances: nesterov-chain and pinball-chain (non-smooth), tridiag-chain (smooth).

Both are convex chains (θ = δ at the input, x = 0, m = 1, Δ fixed orthogonal
layers Q = Q₁⋯Q_Δ, z = θQ), so f(θ) = g(θQ) has the f*, L and R of g and
θ* = z*Qᵀ (Q keeps norms). d is the dimension of θ.

* ``nesterov-chain``: subgradient descent really needs Θ((RL/ε)²) iterations
  (every method that moves in the span of the subgradients it saw needs
  ≥ (RL/(4ε))², and GD at its theory step needs ≤ (RL/ε)²).
* ``pinball-chain``: Gaussian smoothing has a real bias (the minimiser of
  f_γ is not θ*), so γ and the sample count K decide the outcome.
* ``tridiag-chain``: Nesterov's worst-case β-smooth quadratic, on which every
  span method needs Ω(√(βR²/ε)) iterations while d ≥ 2T + 1.
"""

from __future__ import annotations

import math

import numpy as np

from hpcpipe.model import rng
from hpcpipe.model.losses import PinballResidual, TridiagQuadratic
from hpcpipe.model.stages import Batch
from hpcpipe.problems.base import L2Regulariser
from hpcpipe.problems.chains import ChainProblem, _entry, _orth_spec, exact_norm, smooth_check

PINBALL_TAU = 0.75


def nesterov_chain(depth: int, d: int, seed: int, k: int | None = None) -> ChainProblem:
    """f(θ) = max_{j≤k} (θQ)_j + (μ/2)‖θ‖², μ = 1/√k (Nesterov 2004, §3.2.1).

    k ≤ d (default k = d) is the length of the chain of coordinates.

    Minimiser. In z = θQ, g(z) = max_{j≤k} z_j + (μ/2)‖z‖². At z*_j = −1/(μk)
    for j ≤ k, z*_j = 0 for j > k, the first k coordinates tie, so
    (1/k)Σ_{j≤k} e_j ∈ ∂max(z*), and it equals −μz*: 0 ∈ ∂g(z*). g is μ-strongly
    convex, so z* is the unique minimiser and

        f* = −1/(μk) + (μ/2)·k/(μk)² = −1/(2μk) = −1/(2√k),
        R  = ‖θ₀ − θ*‖ = ‖z*‖ = √k/(μk) = 1   (θ₀ = 0, Q orthogonal).

    Lipschitz. A subgradient is e_j Qᵀ + μθ, of norm ≤ 1 + μ‖θ‖; on the ball
    ‖θ‖ ≤ 2R (it holds B(θ*, R)) that is L = 1 + 2μR = 1 + 2/√k.

    Lower bound (Nesterov 2004, Thm 3.2.1). From θ₀ = 0 the oracle answers
    e_{j*}Qᵀ + μθ with j* a maximiser among j ≤ k. While the coordinates of z
    that were never returned are 0 (up to rounding through Q) and the ones
    returned are < 0, j* is a fresh coordinate, so after t steps of any method
    whose iterates lie in the span of the subgradients seen, z_t has at most t
    non-zero coordinates. For t < k some z_{t,j} = 0 with j ≤ k, so
    max_{j≤k} z_{t,j} ≥ 0, f(θ_t) ≥ 0 = f(θ₀) and

        f(θ_t) − f* ≥ 1/(2√k)   for every t < k.

    So ε < 1/(2√k) needs at least k oracle calls. ``hard_chain_length``
    chooses k = ⌊1/(16ε²)⌋, where f(θ₀) − f* ≥ 2ε: with x = RL/ε ≥ 1/ε that is
    k ≈ x²/16 calls at least, while GD at its theory step (η = R/(L√T),
    T = ⌈x²⌉) has min_t f(θ_t) − f* ≤ ε within x² calls: GD's count is Θ(x²).
    """
    k = d if k is None else k
    if not 1 <= k <= d:
        raise ValueError(f"nesterov-chain: need 1 <= k <= d, got k = {k}, d = {d}")
    mu = 1.0 / math.sqrt(k)
    spec = _orth_spec(depth, d, "max", seed, k=k)
    z_star = np.zeros((1, d))
    z_star[0, :k] = -1.0 / (mu * k)
    return ChainProblem(
        "nesterov-chain",
        spec,
        Batch(np.zeros((1, d)), np.zeros((1, d))),
        "input",
        d,
        f_star=-1.0 / (2.0 * math.sqrt(k)),
        L=1.0 + 2.0 * mu * exact_norm(z_star),
        R=exact_norm(z_star),  # = 1
        regulariser=L2Regulariser(mu),
        z_star=z_star,
        info={"chain_length": k},
    )


def hard_chain_length(eps: float) -> int:
    """k = ⌊1/(16ε²)⌋: nesterov-chain's f(θ₀) − f* = 1/(2√k) ≥ 2ε, so every span
    method needs ≥ k iterations to reach ε (see ``nesterov_chain``)."""
    if not 0.0 < eps <= 0.25:
        raise ValueError(f"epsilon must be in (0, 1/4] for a chain of length >= 1, got {eps}")
    return max(1, math.floor(1.0 / (16.0 * eps * eps) * (1 + 1e-12)))


def pinball_chain(depth: int, d: int, seed: int, tau: float = PINBALL_TAU) -> ChainProblem:
    """f(θ) = s·Σ_j ρ_τ((θQ)_j − b_j), ρ_τ(r) = τ·max(r, 0) + (1 − τ)·max(−r, 0).

    s = 1/(max(τ, 1 − τ)·√d), b a seeded Gaussian vector scaled to ‖b‖ = 1.

    Optimum: ρ_τ ≥ 0 with equality only at r = 0, so f* = 0 at the unique
    θ* = bQᵀ; R = ‖θ₀ − θ*‖ = ‖b‖ = 1 from θ₀ = 0. Lipschitz: a subgradient
    is s·vQᵀ with |v_j| ≤ max(τ, 1 − τ), so its norm is ≤ s·max(τ, 1 − τ)·√d:
    L = 1.

    Smoothing bias. With Z ~ N(0, I_d), ZQ ~ N(0, I_d), so
    f_γ(θ) = E f(θ + γZ) = s·Σ_j φ_γ(r_j), r = θQ − b, with (W ~ N(0, 1))

        φ_γ(r) = E ρ_τ(r + γW) = γ·ϕ(r/γ) + r·(Φ(r/γ) − (1 − τ))

    (from E max(r + γW, 0) = rΦ(r/γ) + γϕ(r/γ) and its mirror; ϕ, Φ the
    standard normal density and cdf). φ_γ'(r) = Φ(r/γ) − (1 − τ) vanishes at
    r = γq, q = Φ⁻¹(1 − τ), so f_γ is minimised at θ_γ* = (b + γq·1)Qᵀ, not
    at θ*, for τ ≠ 1/2 (q ≠ 0), and

        f(θ_γ*) − f* = s·d·ρ_τ(γq) = γ√d · (1 − τ)|q| / max(τ, 1 − τ)   (τ ≥ 1/2),

    which is 0.2248·γ√d at τ = 3/4 (the largest value over τ is 0.2267, at
    τ ≈ 0.72): a fixed fraction of the γL√d that the bound allows. A method
    that minimises f_γ ends about there, so γ must be ∝ ε/√d·(…) and the
    noise of a K-sample gradient must be averaged out (compare l1-chain, τ = 1/2,
    and max-chain, whose smoothed minimiser is θ* by symmetry).
    """
    head = PinballResidual(tau)
    spec = _orth_spec(depth, d, "pinball", seed, tau=tau)
    b = rng.data_generator(seed, 1).standard_normal((1, d))
    b /= np.linalg.norm(b)
    return ChainProblem(
        "pinball-chain",
        spec,
        Batch(np.zeros((1, d)), b),
        "input",
        d,
        f_star=0.0,
        L=head.default_scale(d) * max(tau, 1.0 - tau) * math.sqrt(d),  # = 1
        R=exact_norm(b),  # = 1
        z_star=b,
        info={"tau": tau},
    )


def pinball_smoothed(r: np.ndarray, gamma: float, tau: float = PINBALL_TAU) -> np.ndarray:
    """φ_γ(r) = E ρ_τ(r + γW), W ~ N(0, 1), per coordinate (closed form above; γ > 0)."""
    from scipy.stats import norm  # analysis only: a rank never needs it

    u = np.asarray(r, dtype=float) / gamma
    return gamma * norm.pdf(u) + gamma * u * (norm.cdf(u) - (1.0 - tau))


def pinball_smoothing_shift(gamma: float, tau: float = PINBALL_TAU) -> float:
    """γq, q = Φ⁻¹(1 − τ): where φ_γ is minimised (the shift of θ_γ* from θ*, per coordinate)."""
    from scipy.stats import norm

    return float(gamma * norm.ppf(1.0 - tau))


def pinball_smoothing_gap(d: int, gamma: float, tau: float = PINBALL_TAU) -> float:
    """f(θ_γ*) − f* = γ√d·(1 − τ)|q|/max(τ, 1 − τ) for τ ≥ 1/2 (τ·|q| for τ < 1/2)."""
    from scipy.stats import norm

    q = norm.ppf(1.0 - tau)
    rho = (1.0 - tau) * abs(q) if q <= 0 else tau * q
    return float(gamma * math.sqrt(d) * rho / max(tau, 1.0 - tau))


def pinball_speed_limit(b: np.ndarray, eta: float, t: int, tau: float = PINBALL_TAU) -> float:
    """A lower bound on f(θ_t) − f* for PPRS (AC-SA, base step η) on pinball-chain, any γ, K.

    In z = θQ every sample's subgradient is s·v with v_j ∈ {τ, −(1 − τ)}
    (``PinballResidual``), so each coordinate of the K-sample average G lies
    in [−(1 − τ)s, τs]. AC-SA moves x_{i+1} = x_i − iη·G_i (no projection on a
    chain), so after t updates x_{t+1,j} − x_{1,j} ∈ [−τsηS_t, (1 − τ)sηS_t],
    S_t = t(t + 1)/2, and the reported iterate x̄_{t+1} is a convex
    combination of x_1, …, x_{t+1}: the same interval holds for it. From
    θ₀ = 0 a coordinate with b_j > 0 is then at most (1 − τ)sηS_t, one with
    b_j < 0 at least −τsηS_t, and (τ ≥ 1/2 or not)

        f(θ_t) − f* ≥ s·Σ_{b_j>0} (1 − τ)(b_j − (1 − τ)sηS_t)₊ + s·Σ_{b_j<0} τ(|b_j| − τsηS_t)₊.

    A method that steps less (plain momentum, η_i = η) obeys it too. With
    s = 1/(max(τ, 1 − τ)√d) and |b_j| ≈ 1/√d the bound stays above ε until
    ηS_t is of order one: t ∝ η^(−1/2), which is d^(1/4) when η ∝ γ ∝ d^(−1/2).
    """
    d = b.size
    s = 1.0 / (max(tau, 1.0 - tau) * math.sqrt(d))
    move = s * eta * t * (t + 1) / 2.0
    up, down = b[b > 0], -b[b < 0]
    return float(
        s * (1.0 - tau) * np.clip(up - (1.0 - tau) * move, 0.0, None).sum()
        + s * tau * np.clip(down - tau * move, 0.0, None).sum()
    )


def pinball_first_possible(
    b: np.ndarray, eta: float, eps: float, tau: float = PINBALL_TAU, limit: int = 10**7
) -> int:
    """The first t at which ``pinball_speed_limit`` allows f(θ_t) − f* ≤ ε (bisection)."""
    b = np.asarray(b, dtype=float).ravel()
    if pinball_speed_limit(b, eta, 0, tau) <= eps:
        return 0
    lo, hi = 0, 1
    while pinball_speed_limit(b, eta, hi, tau) > eps:
        lo, hi = hi, 2 * hi
        if hi > limit:
            return limit
    while hi - lo > 1:  # the bound decreases in t: bound(lo) > ε >= bound(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pinball_speed_limit(b, eta, mid, tau) > eps else (lo, mid)
    return hi


def tridiag_chain(depth: int, d: int, seed: int, beta: float = 1.0) -> ChainProblem:
    """f(θ) = g(θQ), g Nesterov's worst-case quadratic (Nesterov 2004, §2.1.2, with k = d).

    g(z) = (β/8)(z₁² + Σ_{i<d} (z_i − z_{i+1})² + z_d²) − (β/4)z₁ (``TridiagQuadratic``):
    ∇²g = (β/4)·tridiag(−1, 2, −1) has norm ≤ β, so f is β-smooth and convex.

    Minimiser z*_i = 1 − i/(d+1), f* = (β/8)(−1 + 1/(d+1)); from θ₀ = 0,
    R² = ‖z*‖² = Σ_{j=1}^{d} (j/(d+1))² = d(2d+1)/(6(d+1)).

    Lower bound (Nesterov 2004, Lemma 2.1.5 and Thm 2.1.7). ∇g(z) = Az − b with
    A tridiagonal and b ∝ e₁: if z is supported on the first j coordinates,
    ∇g(z) is supported on the first j + 1. So a method whose iterates lie in the
    span of the gradients it saw (GD, AGD: Q maps that span to z's) has θ_tQ in
    R^{t,d} = span(e₁…e_t) after t oracle calls, and on R^{t,d} g is the
    t-dimensional instance: min over R^{t,d} = (β/8)(−1 + 1/(t+1)). Hence

        f(θ_t) − f* ≥ (β/8)·(1/(t+1) − 1/(d+1))   for every t < d     (``tridiag_span_gap``),

    and reaching ε takes at least N_lb = min{t : (β/8)(1/(t+1) − 1/(d+1)) ≤ ε}
    oracle calls (``tridiag_span_iterations``). While t ≤ T ≤ (d − 1)/2 the bound
    is ≥ β/(16(t+1)), and with d + 1 = 2(T + 1) (so R² ≤ (d + 1)/3 = 2(T + 1)/3) it
    is ≥ 3βR²/(32(T + 1)²) at t = T: Nesterov's Θ(βR²/T²), i.e. Ω(√(βR²/ε))
    iterations, for the T the instance is built for (``tridiag_dim``).
    """
    head = TridiagQuadratic(beta)
    spec = _orth_spec(depth, d, "tridiag", seed, beta=beta)
    z_star = head.minimiser(d)[None, :]
    return ChainProblem(
        "tridiag-chain",
        spec,
        Batch(np.zeros((1, d)), np.zeros((1, d))),
        "input",
        d,
        f_star=head.minimum(d),
        beta=float(beta),
        R=exact_norm(z_star),  # = sqrt(d(2d+1)/(6(d+1)))
        z_star=z_star,
    )


def tridiag_span_gap(t: int, d: int, beta: float = 1.0) -> float:
    """(β/8)(1/(t+1) − 1/(d+1)): f(θ_t) − f* of every span method after t < d calls is
    at least this on tridiag-chain (0 for t ≥ d; see ``tridiag_chain``)."""
    return beta / 8.0 * (1.0 / (t + 1) - 1.0 / (d + 1)) if t < d else 0.0


def tridiag_span_iterations(eps: float, d: int, beta: float = 1.0) -> int:
    """N_lb: the fewest oracle calls after which a span method can have f − f* ≤ ε on
    tridiag-chain of dimension d, the least t with ``tridiag_span_gap(t)`` ≤ ε."""
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    t = max(0, math.ceil(1.0 / (8.0 * eps / beta + 1.0 / (d + 1))) - 1)
    while t > 0 and tridiag_span_gap(t - 1, d, beta) <= eps:  # rounding of the closed form
        t -= 1
    while tridiag_span_gap(t, d, beta) > eps:
        t += 1
    return t


def tridiag_radius(d: int) -> float:
    """R = ‖z*‖ = √(d(2d+1)/(6(d+1))) of tridiag-chain from θ₀ = 0."""
    return math.sqrt(d * (2 * d + 1) / (6.0 * (d + 1)))


def tridiag_dim(eps: float, beta: float = 1.0) -> int:
    """The least d ≥ 2T + 1, T = ⌈√(2βR_d²/ε)⌉ AGD's planned iterations on tridiag-chain of
    dimension d: the span lower bound then covers every iteration AGD runs."""
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    d = 1
    while d < 2 * math.ceil(math.sqrt(2 * beta * tridiag_radius(d) ** 2 / eps)) + 1:
        d += 1
    return d


ENTRIES = {
    "nesterov-chain": _entry(
        "nesterov-chain",
        nesterov_chain,
        "max_{j<=d} (θQ)_j + ‖θ‖²/(2√d): hard for GD when d ≈ (RL/ε)²/16, f* = −1/(2√d)",
    ),
    "pinball-chain": _entry(
        "pinball-chain",
        pinball_chain,
        "pinball loss τ = 3/4 through the chain: Gaussian smoothing biased, L = 1, f* = 0",
    ),
    "tridiag-chain": _entry(
        "tridiag-chain",
        tridiag_chain,
        "Nesterov's worst-case quadratic: β = 1-smooth, span methods need Ω(√(βR²/ε)) steps",
        smooth_check("tridiag-chain"),
    ),
}
