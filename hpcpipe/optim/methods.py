"""GD, AGD and PPRS on local flat vectors, and the theory step/sample rules (theory_plan).

Every rank holds its part of θ (empty on ranks that own none of it) and runs
the same update on it; only norms need a reduction. One oracle call per
iteration at the point y_t:

* GD:    y_t = θ_t;  θ_{t+1} = Π(θ_t − η g(y_t)).
* AGD:   y_t = Π(θ_t + μ_t(θ_t − θ_{t−1})), θ_{t+1} = Π(y_t − η g(y_t)),
         μ_t = (t − 1)/(t + 2) (``momentum="nesterov"``) or a constant.
* PPRS:  AGD where g(y_t) = (1/K) Σ_k ∇f(y_t + γ Z_k) is the K-sample
         estimate of ∇f_γ(y_t), the K samples pushed through the pipeline in
         one call (Colin et al. 2019, Alg. 1).

The extrapolated point is projected as well, so every evaluation point is
feasible (the attack's images stay valid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hpcpipe.errors import need
from hpcpipe.optim.base import Optimizer, OptState, Projection, Settings


class GD(Optimizer):
    """Projected (sub)gradient descent: y_t = θ_t, θ_{t+1} = Π(θ_t − η g(y_t))."""

    name: ClassVar[str] = "gd"
    planned: ClassVar[bool] = True  # theory_plan knows its rule

    def init(self, theta0: np.ndarray, project: Projection) -> OptState:
        return {"theta": project(theta0.copy())}

    def point(self, state: OptState, project: Projection) -> np.ndarray:
        return state["theta"]

    def update(
        self, state: OptState, y: np.ndarray, grad: np.ndarray, project: Projection
    ) -> OptState:
        return {"theta": project(y - self.lr * grad)}


@dataclass
class AGD(Optimizer):
    """Projected Nesterov acceleration over θ_t, θ_{t−1} and the iteration t >= 1.

    y_t = Π(θ_t + μ_t(θ_t − θ_{t−1})), θ_{t+1} = Π(y_t − η g(y_t)), with
    μ_t = (t − 1)/(t + 2) (``momentum="nesterov"``) or a constant in [0, 1).
    """

    name: ClassVar[str] = "agd"
    planned: ClassVar[bool] = True

    momentum: float | str = "nesterov"

    @classmethod
    def check(cls, cfg: Settings) -> None:
        super().check(cfg)
        if cfg.momentum != "nesterov":
            try:
                mu = float(cfg.momentum)
            except ValueError:
                mu = -1.0
            need(0 <= mu < 1, "momentum", cfg.momentum, "'nesterov' or a number in [0, 1)")

    @classmethod
    def from_config(cls, cfg: Settings) -> AGD:
        mom = cfg.momentum if cfg.momentum == "nesterov" else float(cfg.momentum)
        if cls.smoothing:
            return cls(cfg.lr, cfg.gamma, cfg.samples, mom)
        return cls(cfg.lr, momentum=mom)

    def mu(self, t: int) -> float:
        """Momentum at iteration t >= 1."""
        if self.momentum == "nesterov":
            return (t - 1) / (t + 2)
        return float(self.momentum)

    def init(self, theta0: np.ndarray, project: Projection) -> OptState:
        theta = project(theta0.copy())
        return {"theta": theta, "prev": theta.copy(), "t": 1}

    def point(self, state: OptState, project: Projection) -> np.ndarray:
        mu, theta = self.mu(state["t"]), state["theta"]
        if mu == 0.0:
            return theta
        return project(theta + mu * (theta - state["prev"]))

    def update(
        self, state: OptState, y: np.ndarray, grad: np.ndarray, project: Projection
    ) -> OptState:
        return {"theta": project(y - self.lr * grad), "prev": state["theta"], "t": state["t"] + 1}


@dataclass
class PPRS(AGD):
    """AGD on the K-sample estimate of ∇f_γ (Colin et al. 2019, Alg. 1)."""

    name: ClassVar[str] = "pprs"
    smoothing: ClassVar[bool] = True


@dataclass
class Plan:
    """Parameters chosen from a bound, with the bound they guarantee."""

    method: Optimizer
    iterations: int
    guarantee: str


def theory_plan(
    name: str, eps: float, L: float | None, R: float, d: int, beta: float | None = None
) -> Plan:
    """Choose η, T (and γ, K for PPRS) from the rates in DESIGN.md §1.

    Non-smooth (L-Lipschitz convex, ‖θ₀ − θ*‖ ≤ R):

    * GD (subgradient): min_{t≤T} f(θ_t) − f* ≤ (R² + L²η²T)/(2ηT), which is
      RL/√T at η = R/(L√T) (Nesterov 2004, Thm 3.2.2); T = ⌈(RL/ε)²⌉.
    * AGD: the same η and T with momentum (t−1)/(t+2). No guarantee for
      non-smooth f; measured, not claimed.
    * PPRS: f_γ is (L/γ)-smooth with f ≤ f_γ ≤ f + γL√d, and the K-sample
      gradient has variance ≤ L²/K. An accelerated stochastic method (AC-SA,
      Lan 2012, Cor. 1, constants rounded up to 4) gives
      E f(θ_T) − f* ≤ 4LR²/(γT²) + 4LR/√(KT) + γL√d. With γ = 2R d^(−1/4)/T
      the first and last terms sum to 4LR d^(1/4)/T ≤ ε/2 for
      T = ⌈8LR d^(1/4)/ε⌉, and the middle one is ≤ ε/2 for K = ⌈64(LR/ε)²/T⌉.
      Step η = γ/(2L) = 1/(2·smoothness of f_γ). Pipeline time
      T·(K·m + Δ − 1) = O((RL/ε)² + (RL/ε)·Δ·d^(1/4)).

    Smooth (β-smooth convex): AGD with η = 1/β, f(θ_T) − f* ≤ 2βR²/(T+1)²
    (Nesterov 2004, Thm 2.2.2), T = ⌈√(2βR²/ε)⌉; GD with η = 1/β,
    f(θ_T) − f* ≤ βR²/(2T), T = ⌈βR²/(2ε)⌉.
    """
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0, got {eps}")
    if beta is not None and L is None:
        if name == "agd":
            T = math.ceil(math.sqrt(2 * beta * R * R / eps))
            return Plan(
                AGD(1.0 / beta),
                T,
                f"f-f* <= 2bR^2/(T+1)^2 = {2 * beta * R * R / (T + 1) ** 2:.3g}",
            )
        if name == "gd":
            T = math.ceil(beta * R * R / (2 * eps))
            return Plan(GD(1.0 / beta), T, f"f-f* <= bR^2/(2T) = {beta * R * R / (2 * T):.3g}")
        raise ValueError("theory mode on a smooth problem: choose gd or agd")
    if L is None:
        raise ValueError("theory mode needs a problem with a known Lipschitz constant L")
    if name in ("gd", "agd"):
        T = math.ceil((R * L / eps) ** 2)
        eta = R / (L * math.sqrt(T))
        g = f"min f-f* <= RL/sqrt(T) = {R * L / math.sqrt(T):.3g}" if name == "gd" else "none"
        return Plan(GD(eta) if name == "gd" else AGD(eta), T, g)
    if name == "pprs":
        T = math.ceil(8 * L * R * d**0.25 / eps)
        gamma = 2 * R * d**-0.25 / T
        K = max(1, math.ceil(64 * (L * R / eps) ** 2 / T))
        bound = 4 * L * R * d**0.25 / T + 4 * L * R / math.sqrt(K * T)
        return Plan(PPRS(gamma / (2 * L), gamma, K), T, f"E f-f* <= {bound:.3g}")
    raise ValueError(f"optimizer {name!r} has no theory rule: choose gd, agd or pprs")
