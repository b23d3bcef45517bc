"""The problem interface: everything about the objective f that a run needs.

A problem owns its whole objective

    f(θ) = (1/m) Σ_e ℓ(h_Δ ∘ … ∘ h_1(x_e; θ), y_e) + r(θ)

its model (the Δ blocks and the loss head ℓ, each rank building only its
own blocks from the seed), its data (x_e, y_e), which variable θ is (the
input perturbation or the weights), the feasible set (a projection), the
regulariser r, its metrics, the constants the bounds need (f*, L or β, R, d)
and the checks of the settings it reads. The run loop asks the problem; it
never tests which problem it runs.

A problem is registered as a ``ProblemEntry``: ``build(cfg, comm)`` makes the
Problem from the run's settings (the model must have ``cfg.depth`` blocks:
the model-clock costs are per block), ``check(cfg)`` refuses settings it
cannot use with a ConfigError, before any rank starts work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcpipe.errors import need
from hpcpipe.model.stages import Batch, Model
from hpcpipe.registry import RegistryError

# the run's settings (hpcpipe.run.config.RunConfig, a layer above), read by attribute
Settings = Any


@dataclass(frozen=True)
class L2Regulariser:
    """r(θ) = (μ/2)‖θ‖², ∇r(θ) = μθ, evaluated on each rank's part of θ (the sum is r)."""

    mu: float

    def value(self, theta: np.ndarray) -> float:
        return 0.5 * self.mu * float(theta @ theta)

    def grad(self, theta: np.ndarray) -> np.ndarray:
        return self.mu * theta


@dataclass
class Problem:
    """What the optimizer needs to know about f.

    ``spec`` is the model (any ``hpcpipe.model.stages.Model``); ``variable``
    is "input" (θ = δ added to the inputs, owned by stage 0, shape (m, d_in))
    or "weights" (each stage owns its own). ``dim`` = d, the size of θ.
    ``regulariser`` (value/grad on a rank's part of θ) is added to the
    pipeline's loss and gradient; ``box`` is the feasible set [lo, hi] of an
    input variable. ``weights`` replaces the seeded initial weights (e.g. a
    trained classifier). ``info`` is stored with the result.
    """

    name: str
    spec: Model
    batch: Batch
    variable: str
    dim: int
    f_star: float | None = None
    L: float | None = None
    beta: float | None = None
    R: float | None = None
    regulariser: L2Regulariser | None = None
    weights: np.ndarray | None = None
    box: tuple[np.ndarray, np.ndarray] | None = None
    info: dict = field(default_factory=dict)

    @property
    def depth(self) -> int:
        """Δ, the number of blocks of the model: the model clock charges each of them."""
        return self.spec.depth

    def project(self, theta: np.ndarray) -> np.ndarray:
        """Euclidean projection on the box (ℓ∞ ball ∩ valid inputs): a clip, exact."""
        if self.box is None or theta.size == 0:
            return theta
        return np.clip(theta, self.box[0], self.box[1])

    def metrics(self, item_losses: np.ndarray) -> dict[str, float]:
        """Figures of the exact evaluation at θ_t beyond f (per-item losses as input)."""
        return {}

    def final_metrics(self, theta0: np.ndarray, theta: np.ndarray) -> dict[str, Any]:
        """Figures of the whole θ₀ and final θ (gathered on every rank), e.g. a held-out
        accuracy; stored with the result. None by default (nothing is gathered)."""
        return {}

    def constants(self) -> dict[str, Any]:
        """The known constants, as stored with a result."""
        return {
            "name": self.name,
            "dim": self.dim,
            "depth": self.depth,
            "f_star": self.f_star,
            "L": self.L,
            "beta": self.beta,
            "R": self.R,
        }


def no_check(cfg: Settings) -> None:
    """A problem that reads no settings beyond the common ones refuses none."""


@dataclass(frozen=True)
class ProblemEntry:
    """A registered problem: how to build it from the settings and what it refuses.

    ``theory``: the problem knows L or β and R, so ``mode = "theory"`` can
    plan from them.
    """

    build: Callable[..., Problem]  # build(cfg, comm) -> Problem
    check: Callable[..., None] = no_check  # check(cfg): raise ConfigError
    theory: bool = False
    about: str = ""


def as_entry(obj: object, name: str) -> ProblemEntry:
    """A ProblemEntry as is, or a factory ``f(cfg, comm) -> Problem`` (its optional
    ``check`` and ``theory`` attributes are used)."""
    if isinstance(obj, ProblemEntry):
        return obj
    if not callable(obj):
        raise RegistryError(f"problem {name!r}: expected a ProblemEntry or a factory(cfg, comm)")
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return ProblemEntry(
        obj,
        getattr(obj, "check", no_check),
        bool(getattr(obj, "theory", False)),
        doc[0] if doc else "",
    )


def need_single_example(name: str) -> Callable[..., None]:
    """The check of a problem with one example (m = 1)."""

    def check(cfg: Settings) -> None:
        need(cfg.m == 1, "m", cfg.m, f"{name} has one example (m = 1)")

    return check
