"""The optimizer interface: explicit state, in the manner of optax's init / update.

An optimizer makes one oracle call per iteration, at the point it chooses:

    state = opt.init(θ₀, project)          # a named dict: arrays and scalars
    y     = opt.point(state, project)      # where the pipeline evaluates g
    state = opt.update(state, y, g, project)

``state`` holds this rank's parts of θ-shaped arrays (each with the layout of
θ's local part; ``state["theta"]`` is the current iterate θ_t) and plain
Python scalars (int or float, equal on every rank). Nothing else: so the
run saves and restores any optimizer's state generically and bitwise
(``--resume``). ``project`` is the problem's Euclidean projection Π on the
feasible set (identity on ranks that own none of θ).

``gamma`` and ``samples`` tell the pipeline how to call the oracle: with
γ > 0 and K samples it returns the K-sample estimate of ∇f_γ (PPRS); an
optimizer that does no smoothing keeps γ = 0 and K = 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from hpcpipe.errors import need

# the run's settings (hpcpipe.run.config.RunConfig, a layer above), read by attribute
Settings = Any
OptState = dict[str, Any]  # name -> np.ndarray (θ's local layout) | int | float
Projection = Callable[[np.ndarray], np.ndarray]


@dataclass
class Optimizer:
    """Base class: settings as fields, the rule as init / point / update."""

    name: ClassVar[str] = "optimizer"
    smoothing: ClassVar[bool] = False  # may it ask the oracle for γ > 0, K > 1?
    planned: ClassVar[bool] = False  # does theory_plan (mode = "theory") know its rule?

    lr: float
    gamma: float = 0.0
    samples: int = 1

    def __post_init__(self):
        if not self.smoothing and (self.gamma != 0.0 or self.samples != 1):
            raise ValueError(f"{self.name} takes no smoothing: gamma must be 0 and samples 1")

    # ------------------------------------------------------------ from the settings
    @classmethod
    def check(cls, cfg: Settings) -> None:
        """Refuse settings this optimizer cannot use (ConfigError naming the field)."""
        if not cls.smoothing:
            need(
                cfg.samples == 1,
                "samples",
                cfg.samples,
                f"{cfg.optimizer} uses one sample; use optimizer = 'pprs' for K > 1",
            )
            need(
                cfg.gamma == 0,
                "gamma",
                cfg.gamma,
                f"{cfg.optimizer} does no smoothing; use optimizer = 'pprs'",
            )

    @classmethod
    def from_config(cls, cfg: Settings) -> Optimizer:
        """The optimizer of ``mode = "practical"`` from lr (and gamma, samples)."""
        if cls.smoothing:
            return cls(cfg.lr, cfg.gamma, cfg.samples)
        return cls(cfg.lr)

    def describe(self) -> dict:
        """Name and settings, as stored with a result."""
        return {"name": self.name, **dataclasses.asdict(self)}

    # ------------------------------------------------------------ the rule
    def init(self, theta0: np.ndarray, project: Projection) -> OptState:
        raise NotImplementedError

    def point(self, state: OptState, project: Projection) -> np.ndarray:
        raise NotImplementedError

    def next_point_is_theta(self, state: OptState) -> bool:
        """Whether ``point(state)`` may be ``state["theta"]`` itself. The runner then
        evaluates f(θ) with its gradient and keeps the answer for that oracle call
        (``runner.exact_f``); otherwise f(θ) needs no backward pass. True unless a rule
        says otherwise, so a rule that does not answer keeps that reuse."""
        return True

    def update(
        self, state: OptState, y: np.ndarray, grad: np.ndarray, project: Projection
    ) -> OptState:
        raise NotImplementedError


def split_state(state: OptState) -> tuple[dict[str, np.ndarray], dict[str, int | float]]:
    """(arrays, scalars) of a state, each in sorted name order."""
    arrays = {k: v for k, v in sorted(state.items()) if isinstance(v, np.ndarray)}
    scalars = {k: v for k, v in sorted(state.items()) if not isinstance(v, np.ndarray)}
    for k, v in scalars.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise TypeError(f"optimizer state {k!r}: expected an array, int or float, got {v!r}")
    return arrays, scalars
