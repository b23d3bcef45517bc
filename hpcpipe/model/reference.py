"""Single-process reference: the same layers composed in one process, no MPI.

Evaluates exactly what one engine call evaluates, written as plainly as
possible (whole batch, one sample after another), so that tests can compare
the distributed engine with it and anyone can get the exact numbers:

    f_k = (1/m) Σ_e ℓ(h(x_e; θ + γ Z_k), y_e),   g = Σ_k ∇f_k  or  (1/K) Σ_k ∇f_k.

The weight vector's layout is the concatenation of the stages' flat vectors,
which for contiguous stages does not depend on the partition.
"""

from __future__ import annotations

import numpy as np

from hpcpipe.model import rng
from hpcpipe.model.layers import backward_layers, forward_layers
from hpcpipe.model.stages import VARIABLES, Batch, Model, Stage


class Reference:
    """The whole model in one process."""

    def __init__(self, spec: Model, batch: Batch, variable: str = "input", seed: int = 0):
        if variable not in VARIABLES:
            raise ValueError(f"variable {variable!r}: choose one of {', '.join(VARIABLES)}")
        self.spec, self.batch, self.variable, self.seed = spec, batch, variable, seed
        self.model = Stage(spec, 0, spec.depth, 0, 1)
        self.size = batch.m * spec.d_in if variable == "input" else self.model.size

    def initial_point(self) -> np.ndarray:
        return np.zeros(self.size) if self.variable == "input" else self.model.flat.copy()

    def loss_and_grad(
        self,
        point: np.ndarray,
        gamma: float = 0.0,
        call: int = 0,
        samples: int = 1,
        reduce: str = "mean",
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-sample losses f_k (K,) and the gradient at ``point``."""
        mdl, b = self.model, self.batch
        losses = np.zeros(samples)
        grad = np.zeros(self.size)
        for k in range(samples):
            if self.variable == "weights":
                p = mdl.views(mdl.perturbed(point, gamma, self.seed, call, k))
                x = b.x
                gv = mdl.views(grad)
            else:
                p = mdl.views(mdl.flat)
                x = b.x + point.reshape(b.x.shape)
                if gamma != 0.0:
                    x = x + gamma * rng.noise(self.seed, call, rng.INPUT_PARAM_ID, k, x.shape)
                gv = None
            y, caches = forward_layers(mdl.layers, x, p)
            losses[k], dz = mdl.head(y, b.targets, 1.0 / b.m)
            dx = backward_layers(mdl.layers, dz, caches, p, gv)
            if self.variable == "input":
                grad += dx.reshape(-1)
        if reduce == "mean":
            grad /= samples
        return losses, grad

    def loss(self, point: np.ndarray, gamma: float = 0.0, call: int = 0, samples: int = 1) -> float:
        return float(self.loss_and_grad(point, gamma, call, samples)[0].mean())
