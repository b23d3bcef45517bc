"""GD, AGD and PPRS on local flat vectors, and the theory step/sample rules (theory_plan).

Every rank holds its part of θ (empty on ranks that own none of it) and runs
the same update on it; only norms need a reduction. One oracle call per
iteration at the point y_t:

* GD:    y_t = θ_t;  θ_{t+1} = Π(θ_t − η g(y_t)).
* AGD:   y_t = Π(θ_t + μ_t(θ_t − θ_{t−1})), θ_{t+1} = Π(y_t − η g(y_t)),
         μ_t = (t − 1)/(t + 2) (``momentum="nesterov"``) or a constant.
* PPRS:  AGD where g(y_t) = (1/K) Σ_k ∇f(y_t + γ Z_k) is the K-sample
         estimate of ∇f_γ(y_t), the K samples pushed through the pipeline in
         one call (Colin et al. 2019, Alg. 1); or, with ``momentum="acsa"``
         (what theory mode runs), AC-SA's three-sequence update with the bound
         proven in ``hpcpipe.optim.acsa``.

The extrapolated point is projected as well, so every evaluation point is
feasible (the attack's images stay valid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hpcpipe.errors import need
from hpcpipe.optim.acsa import acsa_init, acsa_plan, acsa_point, acsa_update
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

    #: momentum names besides a number: AGD's and PPRS's Nesterov rule, PPRS's AC-SA rule
    named_momenta: ClassVar[tuple[str, ...]] = ("nesterov",)

    @classmethod
    def check(cls, cfg: Settings) -> None:
        super().check(cfg)
        if cfg.momentum not in cls.named_momenta:
            try:
                mu = float(cfg.momentum) if cfg.momentum.isascii() else -1.0
            except ValueError:
                mu = -1.0
            names = " or ".join(repr(m) for m in cls.named_momenta)
            need(0 <= mu < 1, "momentum", cfg.momentum, f"{names} or a number in [0, 1)")

    @classmethod
    def from_config(cls, cfg: Settings) -> AGD:
        mom = cfg.momentum if cfg.momentum in cls.named_momenta else float(cfg.momentum)
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

    def next_point_is_theta(self, state: OptState) -> bool:
        """Only where the momentum is 0 (Nesterov's rule: the first iteration only): AGD's
        f(θ) with a gradient every iteration took a fifth of its runs' CPU (x = 256)."""
        return self.mu(state["t"]) == 0.0

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
    """AGD on the K-sample estimate of ∇f_γ (Colin et al. 2019, Alg. 1).

    With ``momentum="acsa"`` (what theory mode runs) the rule is AC-SA's
    three-sequence update (``hpcpipe.optim.acsa``, base step ``lr`` = η, state
    x̄ = θ, x and t), for which that module proves the final-iterate bound.
    """

    name: ClassVar[str] = "pprs"
    smoothing: ClassVar[bool] = True
    named_momenta: ClassVar[tuple[str, ...]] = ("nesterov", "acsa")

    def init(self, theta0: np.ndarray, project: Projection) -> OptState:
        if self.momentum == "acsa":
            return acsa_init(theta0, project)
        return super().init(theta0, project)

    def next_point_is_theta(self, state: OptState) -> bool:
        """Never under AC-SA (its query point is a new array), else AGD's answer."""
        return self.momentum != "acsa" and super().next_point_is_theta(state)

    def point(self, state: OptState, project: Projection) -> np.ndarray:
        if self.momentum == "acsa":
            return acsa_point(state)
        return super().point(state, project)

    def update(
        self, state: OptState, y: np.ndarray, grad: np.ndarray, project: Projection
    ) -> OptState:
        if self.momentum == "acsa":
            return acsa_update(state, grad, self.lr, project)
        return super().update(state, y, grad, project)


@dataclass
class Plan:
    """Parameters chosen from a bound, with the bound they guarantee."""

    method: Optimizer
    iterations: int
    guarantee: str


def theory_plan(
    name: str, eps: float, L: float | None, R: float, d: int, beta: float | None = None
) -> Plan:
    """Choose η, T (and γ, K for PPRS) from the rates in docs/design.md §1.

    Non-smooth (L-Lipschitz convex, ‖θ₀ − θ*‖ ≤ R):

    * GD (subgradient): min_{t≤T} f(θ_t) − f* ≤ (R² + L²η²T)/(2ηT), which is
      RL/√T at η = R/(L√T) (Nesterov 2004, Thm 3.2.2); T = ⌈(RL/ε)²⌉.
    * AGD: the same η and T with momentum (t−1)/(t+2). No guarantee for
      non-smooth f; measured, not claimed.
    * PPRS: AC-SA's three-sequence update on f_γ (``hpcpipe.optim.acsa``,
      momentum "acsa"), with the theorem proven there for that update:
      E f(θ_T) − f* ≤ R²/(ηT(T+1)) + ηL²(2T+1)/(3K) + γL√d at the final
      iterate, for η ≤ γ/(4L). ``acsa_plan`` derives T = ⌈8LR d^(1/4)/ε⌉,
      γ = 2R d^(−1/4)/T, K = ⌈16(LR/ε)²(2T+1)/(3T(T+1))⌉ and
      η = min(γ/(4L), η_σ) from it, which make the bound ≤ ε. Pipeline time
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
        p = acsa_plan(eps, L, R, d)
        return Plan(
            PPRS(p.eta, p.gamma, p.samples, momentum="acsa"),
            p.iterations,
            f"E f(theta_T)-f* <= {p.bound:.3g} (final iterate)",
        )
    raise ValueError(f"optimizer {name!r} has no theory rule: choose gd, agd or pprs")
