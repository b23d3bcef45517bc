"""PPRS's accelerated stochastic method and the bound proven for the update that runs.

The update is AC-SA's (Lan 2012, "An optimal method for stochastic composite
optimization", Math. Program. 133, §3): three sequences, weights
a_t = 2/(t + 1), steps growing linearly in t and capped by both the
smoothness and the noise. The theorem below is proven here for exactly this
update (the constants used by ``acsa_plan`` come from it, not from Lan's
corollaries).

Theorem. Let F be convex on a closed convex set X with a β-Lipschitz
gradient, and let each call return G(y) = ∇F(y) + ξ with E[ξ | past] = 0 and
E[‖ξ‖² | past] ≤ σ². Start from x₁ = x̄₁ = θ₀ ∈ X and, for t = 1, …, T, with
a_t = 2/(t + 1), η_t = t·η and 0 < η ≤ 1/(4β):

    y_t     = (1 − a_t)·x̄_t + a_t·x_t            (the oracle is called here)
    x_{t+1} = Π_X(x_t − η_t·G(y_t))
    x̄_{t+1} = (1 − a_t)·x̄_t + a_t·x_{t+1}         (the iterate θ_t reported)

Then for every u ∈ X, at the final iterate,

    E F(x̄_{T+1}) − F(u) ≤ ‖θ₀ − u‖²/(η·T(T + 1)) + η·σ²·(2T + 1)/3.

Proof. Write Δ_t = x_{t+1} − x_t; then x̄_{t+1} − y_t = a_t·Δ_t.
(1) β-smoothness, then convexity at y_t towards x̄_t:
    F(x̄_{t+1}) ≤ F(y_t) + ⟨∇F(y_t), x̄_{t+1} − y_t⟩ + (β a_t²/2)‖Δ_t‖²
               ≤ (1 − a_t)F(x̄_t) + a_t[F(y_t) + ⟨∇F(y_t), x_{t+1} − y_t⟩] + (β a_t²/2)‖Δ_t‖².
(2) Convexity towards u, ∇F = G − ξ, and the projection's three-point
    inequality η_t⟨G, x_{t+1} − u⟩ ≤ ½‖u − x_t‖² − ½‖u − x_{t+1}‖² − ½‖Δ_t‖²:
    F(y_t) + ⟨∇F(y_t), x_{t+1} − y_t⟩ ≤ F(u) + ⟨G, x_{t+1} − u⟩ − ⟨ξ_t, x_{t+1} − u⟩
      ≤ F(u) + (‖u − x_t‖² − ‖u − x_{t+1}‖² − ‖Δ_t‖²)/(2η_t) − ⟨ξ_t, x_t − u⟩ − ⟨ξ_t, Δ_t⟩.
(3) Young: −⟨ξ_t, Δ_t⟩ ≤ η_t‖ξ_t‖² + ‖Δ_t‖²/(4η_t). The ‖Δ_t‖² terms then sum
    to a_t‖Δ_t‖²(β a_t/2 − 1/(4η_t)) ≤ 0, because β·a_t·η_t = 2tβη/(t + 1) < 2βη ≤ 1/2.
(4) With Γ_t = 2/(t(t + 1)) (so Γ₁ = 1, 1 − a_t = Γ_t/Γ_{t−1}, a_t/Γ_t = t,
    a_t/(η_t Γ_t) = 1/η), dividing by Γ_t:
    (F(x̄_{t+1}) − F(u))/Γ_t ≤ (F(x̄_t) − F(u))/Γ_{t−1}·[t > 1]
        + (‖u − x_t‖² − ‖u − x_{t+1}‖²)/(2η) + t²η‖ξ_t‖² − t⟨ξ_t, x_t − u⟩.
(5) Sum over t = 1..T (the distances telescope), take expectations:
    E⟨ξ_t, x_t − u⟩ = 0 (x_t is fixed before ξ_t is drawn), E‖ξ_t‖² ≤ σ²,
    Σ t² = T(T + 1)(2T + 1)/6; multiply by Γ_T = 2/(T(T + 1)).  ∎

Application to PPRS (Colin et al. 2019, Alg. 1). f is convex and L-Lipschitz
(its subgradients, at every point the smoothing reaches, have norm ≤ L);
F = f_γ(θ) = E f(θ + γZ), Z ~ N(0, I_d); G = (1/K)Σ_k ∇f(y + γZ_k).
  (i)  f ≤ f_γ: f(θ + γZ) ≥ f(θ) + ⟨g, γZ⟩, take expectations.
  (ii) f_γ(θ) − f(θ) ≤ γL·E‖Z‖ ≤ γL√d.
  (iii) ∇f_γ(θ) = E ∇f(θ + γZ) (f is differentiable a.e. and Z has a density),
       and ‖∇f_γ(θ) − ∇f_γ(θ')‖ ≤ L·∫|p_θ − p_θ'| = 2L(2Φ(δ/2γ) − 1) ≤ √(2/π)·Lδ/γ,
       δ = ‖θ − θ'‖, p_θ the density of N(θ, γ²I): β = L/γ suffices.
  (iv) ‖∇f(·)‖ ≤ L, so E‖G − ∇f_γ‖² = (E‖∇f(y + γZ)‖² − ‖∇f_γ(y)‖²)/K ≤ L²/K = σ².
With u = θ*, R = ‖θ₀ − θ*‖, (ii) at θ* and (i) at x̄_{T+1}:

    E f(x̄_{T+1}) − f* ≤ R²/(ηT(T + 1)) + ηL²(2T + 1)/(3K) + γL√d,   η ≤ γ/(4L).

A regulariser r(θ) = (μ/2)‖θ‖² added exactly (not smoothed; max-chain,
nesterov-chain) keeps this with L ≥ L_g + 2μR (L_g: the smoothed part's
constant): F = g_γ + r is (L_g/γ + μ)-smooth and L_g/γ + μ ≤ L/γ when γ ≤ 2R;
the noise and the bias come from g alone (σ ≤ L_g/√K ≤ L/√K, bias ≤ γL_g√d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ACSAPlan:
    """PPRS settings for accuracy ε and the bound the theorem gives for them."""

    iterations: int  # T
    gamma: float  # γ
    samples: int  # K
    eta: float  # η, the base step (η_t = tη)
    optimisation: float  # R²/(ηT(T + 1))
    noise: float  # ηL²(2T + 1)/(3K)
    bias: float  # γL√d

    @property
    def bound(self) -> float:
        """E f(θ_T) − f* ≤ bound, at the final iterate."""
        return self.optimisation + self.noise + self.bias


def acsa_terms(
    L: float, R: float, d: int, gamma: float, samples: int, T: int, eta: float
) -> tuple[float, float, float]:
    """The three terms of the bound for the given settings (requires η ≤ γ/(4L))."""
    if eta > gamma / (4 * L) * (1 + 1e-12):
        raise ValueError(f"the bound needs eta <= gamma/(4L) = {gamma / (4 * L):.3g}, got {eta}")
    return (
        R * R / (eta * T * (T + 1)),
        eta * L * L * (2 * T + 1) / (3 * samples),
        gamma * L * math.sqrt(d),
    )


def acsa_plan(eps: float, L: float, R: float, d: int) -> ACSAPlan:
    """T, γ, K and η for E f(θ_T) − f* ≤ ε, derived from the theorem above.

    * γ = 2R d^(−1/4)/T makes 4LR²/(γT²) = γL√d = 2LR d^(1/4)/T; with
      T = ⌈8LR d^(1/4)/ε⌉ the two sum to ≤ ε/2 (and T(T + 1) ≥ T²).
    * η = min(γ/(4L), η_σ), η_σ = R·√(3K/(L²T(T + 1)(2T + 1))) the step that
      balances the first two terms. Then R²/(ηT(T + 1)) ≤ 4LR²/(γT(T + 1)) + A
      and ηL²(2T + 1)/(3K) ≤ A, A = RL·√((2T + 1)/(3KT(T + 1))).
    * K = ⌈16(LR/ε)²(2T + 1)/(3T(T + 1))⌉ (≈ (32/3)(LR/ε)²/T) makes 2A ≤ ε/2.

    Total ≤ ε. Pipeline time T·(K·m + Δ − 1) = O((RL/ε)² + (RL/ε)·Δ·d^(1/4)).
    """
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    T = math.ceil(8 * L * R * d**0.25 / eps)
    gamma = 2 * R * d**-0.25 / T
    K = max(1, math.ceil(16 * (L * R / eps) ** 2 * (2 * T + 1) / (3 * T * (T + 1))))
    eta_sigma = R * math.sqrt(3 * K / (L * L * T * (T + 1) * (2 * T + 1)))
    eta = min(gamma / (4 * L), eta_sigma)
    return ACSAPlan(T, gamma, K, eta, *acsa_terms(L, R, d, gamma, K, T, eta))


def acsa_init(theta0: np.ndarray, project) -> dict:
    """The state at t = 1: x̄₁ = x₁ = Π(θ₀) (named arrays and the counter t; PPRS's
    state with ``momentum="acsa"``, saved and resumed like any optimizer's)."""
    theta = project(theta0.copy())
    return {"theta": theta, "x": theta.copy(), "t": 1}


def acsa_point(state: dict) -> np.ndarray:
    """y_t = (1 − a_t)·x̄_t + a_t·x_t, a_t = 2/(t + 1) (feasible: a convex combination)."""
    a = 2.0 / (state["t"] + 1)
    return (1.0 - a) * state["theta"] + a * state["x"]


def acsa_update(state: dict, grad: np.ndarray, eta: float, project) -> dict:
    """x_{t+1} = Π(x_t − tη·g), x̄_{t+1} = (1 − a_t)·x̄_t + a_t·x_{t+1}, t ← t + 1."""
    t = state["t"]
    a = 2.0 / (t + 1)
    x = project(state["x"] - (t * eta) * grad)
    return {"theta": (1.0 - a) * state["theta"] + a * x, "x": x, "t": t + 1}
