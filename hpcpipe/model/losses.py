"""Loss heads: per-example losses of the network output and their gradients.

A head maps the output z (rows, c) and the targets of those rows to the *sum*
of the per-example losses, weighted by ``weight`` (the engine passes 1/m so
that a sample's loss is the mean over its m examples however they are split
into microbatches), and returns dL/dz.
"""

from __future__ import annotations

import numpy as np

Array = np.ndarray


class LossHead:
    """Base class. ``targets`` is int labels (classification) or a float array."""

    name = "loss"

    def __call__(self, z: Array, targets: Array, weight: float) -> tuple[float, Array]:
        raise NotImplementedError


class SoftmaxCrossEntropy(LossHead):
    """ℓ(z, y) = logsumexp(z) − z_y;  ∂ℓ/∂z = softmax(z) − e_y."""

    name = "cross_entropy"

    def __call__(self, z, targets, weight):
        zmax = z.max(axis=1, keepdims=True)
        e = np.exp(z - zmax)
        s = e.sum(axis=1, keepdims=True)
        rows = np.arange(z.shape[0])
        loss = (np.log(s[:, 0]) + zmax[:, 0] - z[rows, targets]).sum()
        dz = e / s
        dz[rows, targets] -= 1.0
        return weight * float(loss), weight * dz


class Margin(LossHead):
    """Carlini–Wagner margin ℓ(z, y) = max(z_y − max_{j≠y} z_j, −κ).

    Minimising it pushes the true-class logit below the best other class
    (an untargeted attack succeeds when ℓ < 0). Subgradient: e_y − e_{j*}
    where the margin is above −κ, 0 where it is clipped.

    ``targeted``: y is the class to reach and ℓ(z, y) = max(max_{j≠y} z_j −
    z_y, −κ) (Carlini and Wagner 2017, eq. (6) with their f₆); the attack
    succeeds when ℓ < 0 (y becomes the predicted class). Subgradient
    e_{j*} − e_y where active.
    """

    name = "margin"

    def __init__(self, kappa: float = np.inf, targeted: bool = False):
        self.kappa, self.sign = kappa, -1.0 if targeted else 1.0

    def __call__(self, z, targets, weight):
        rows = np.arange(z.shape[0])
        zy = z[rows, targets]
        other = z.copy()
        other[rows, targets] = -np.inf
        j = other.argmax(axis=1)
        margin = self.sign * (zy - other[rows, j])
        active = margin > -self.kappa
        loss = np.where(active, margin, -self.kappa).sum()
        dz = np.zeros_like(z)
        dz[rows[active], targets[active]] = self.sign
        dz[rows[active], j[active]] -= self.sign
        return weight * float(loss), weight * dz


class AbsResidual(LossHead):
    """ℓ(z, b) = scale · ‖z − b‖₁, scale = 1/√c by default.

    With scale 1/√c the head is 1-Lipschitz in ℓ2 (‖sign‖₂ = √c), which makes
    the ``l1-chain`` problem L = 1. Subgradient: scale · sign(z − b).
    """

    name = "abs"

    def __init__(self, scale: float | None = None):
        self.scale = scale

    def __call__(self, z, targets, weight):
        scale = self.scale if self.scale is not None else 1.0 / np.sqrt(z.shape[1])
        r = z - targets
        return weight * scale * float(np.abs(r).sum()), (weight * scale) * np.sign(r)


class SquaredResidual(LossHead):
    """ℓ(z, b) = ½ Σ_j λ_j (z_j − b_j)²;  ∂ℓ/∂z = λ ⊙ (z − b); β-smooth with β = max λ.

    ``lambdas`` defaults to all ones (plain ½‖z − b‖², 1-smooth).
    """

    name = "squared"

    def __init__(self, lambdas=None):
        self.lambdas = None if lambdas is None else np.asarray(lambdas, dtype=float)

    def __call__(self, z, targets, weight):
        r = z - targets
        lr = r if self.lambdas is None else self.lambdas * r
        return weight * 0.5 * float((r * lr).sum()), weight * lr


class MaxHead(LossHead):
    """ℓ(z) = max_{j<k} z_j (targets ignored); subgradient e_{j*}, j* the first maximiser.

    ``k`` defaults to all c coordinates. With k < c the head is Nesterov's
    max over the first k coordinates only (Nesterov 2004, §3.2.1).
    """

    name = "max"

    def __init__(self, k: int | None = None):
        if k is not None and k < 1:
            raise ValueError(f"max head: k must be >= 1, got {k}")
        self.k = k

    def __call__(self, z, targets, weight):
        rows = np.arange(z.shape[0])
        j = z[:, : self.k].argmax(axis=1)
        dz = np.zeros_like(z)
        dz[rows, j] = weight
        return weight * float(z[rows, j].sum()), dz


class PinballResidual(LossHead):
    """ℓ(z, b) = scale · Σ_j ρ_τ(z_j − b_j), ρ_τ(r) = τ·max(r, 0) + (1 − τ)·max(−r, 0).

    The asymmetric absolute value (quantile loss), convex, minimised at z = b.
    Subgradient: scale·(τ·[r > 0] − (1 − τ)·[r < 0]) (0 at r = 0, which lies in
    [−(1 − τ), τ]). Each coordinate of it is at most max(τ, 1 − τ) in absolute
    value, so the default scale = 1/(max(τ, 1 − τ)·√c) makes the head
    1-Lipschitz in ℓ2. Its Gaussian smoothing is biased for τ ≠ 1/2: see
    ``hpcpipe.problems.worstcase.pinball_chain``.
    """

    name = "pinball"

    def __init__(self, tau: float = 0.75, scale: float | None = None):
        if not 0.0 < tau < 1.0:
            raise ValueError(f"pinball head: tau must be in (0, 1), got {tau}")
        self.tau, self.scale = float(tau), scale

    def default_scale(self, c: int) -> float:
        return 1.0 / (max(self.tau, 1.0 - self.tau) * np.sqrt(c))

    def __call__(self, z, targets, weight):
        scale = self.scale if self.scale is not None else self.default_scale(z.shape[1])
        r = z - targets
        pos, neg = np.maximum(r, 0.0), np.maximum(-r, 0.0)
        loss = float((self.tau * pos + (1.0 - self.tau) * neg).sum())
        dz = np.where(r > 0, self.tau, np.where(r < 0, self.tau - 1.0, 0.0))
        return weight * scale * loss, (weight * scale) * dz


class TridiagQuadratic(LossHead):
    """Nesterov's worst-case smooth convex quadratic (Nesterov 2004, §2.1.2).

    ℓ(z) = (β/8)·(z₁² + Σ_{i<c} (z_i − z_{i+1})² + z_c²) − (β/4)·z₁ = ½ zᵀAz − bᵀz
    with A = (β/4)·tridiag(−1, 2, −1) (so ‖A‖ ≤ β) and b = (β/4)e₁. Minimiser
    z*_i = 1 − i/(c+1), minimum f* = (β/8)(−1 + 1/(c+1)). Targets ignored.
    """

    name = "tridiag"

    def __init__(self, beta: float = 1.0):
        self.beta = float(beta)

    def __call__(self, z, targets, weight):
        q = self.beta / 4.0
        az = 2.0 * z
        az[:, 1:] -= z[:, :-1]
        az[:, :-1] -= z[:, 1:]
        grad = q * az
        grad[:, 0] -= q
        loss = 0.5 * float((z * (q * az)).sum()) - q * float(z[:, 0].sum())
        return weight * loss, weight * grad

    def minimiser(self, c: int) -> np.ndarray:
        return 1.0 - np.arange(1, c + 1) / (c + 1)

    def minimum(self, c: int) -> float:
        return self.beta / 8.0 * (-1.0 + 1.0 / (c + 1))


class ZeroChain(LossHead):
    """Carmon, Duchi, Hinder, Sidford's hard non-convex chain (Math. Prog. 2020, eq. (9)).

    ℓ(z) = −Ψ(1)Φ(z₁) + Σ_{i=2}^{c} [Ψ(−z_{i−1})Φ(−z_i) − Ψ(z_{i−1})Φ(z_i)] (targets
    ignored), with Ψ(x) = 0 for x ≤ 1/2, exp(1 − 1/(2x − 1)²) for x > 1/2, and
    Φ(x) = √e ∫_{−∞}^x e^{−t²/2} dt = √(2πe)·N(x) (N the standard normal cdf).
    Ψ'(x) = Ψ(x)·4/(2x − 1)³ (x > 1/2), Φ'(x) = √e·e^{−x²/2}; so

        ∂ℓ/∂z_j = −[Ψ(−z_{j−1})Φ'(−z_j) + Ψ(z_{j−1})Φ'(z_j)]   (j ≥ 2; −Φ'(z₁) for j = 1)
                  − [Ψ'(−z_j)Φ(−z_{j+1}) + Ψ'(z_j)Φ(z_{j+1})]   (j < c).

    Ψ vanishes on (−∞, 1/2], so ∂ℓ/∂z_{j+1} = 0 while |z_j| ≤ 1/2 (a "zero chain").
    """

    name = "zero-chain"

    SQRT_E = float(np.sqrt(np.e))

    @staticmethod
    def psi(x: Array) -> tuple[Array, Array]:
        """Ψ(x) and Ψ'(x)."""
        out, dout = np.zeros_like(x), np.zeros_like(x)
        m = x > 0.5
        u = 2.0 * x[m] - 1.0
        out[m] = np.exp(1.0 - 1.0 / (u * u))
        dout[m] = out[m] * 4.0 / (u * u * u)
        return out, dout

    @classmethod
    def phi(cls, x: Array) -> tuple[Array, Array]:
        """Φ(x) and Φ'(x)."""
        from scipy.special import ndtr

        return cls.SQRT_E * np.sqrt(2.0 * np.pi) * ndtr(x), cls.SQRT_E * np.exp(-0.5 * x * x)

    def __call__(self, z, targets, weight):
        a, b = z[:, :-1], z[:, 1:]
        pa, dpa = self.psi(a)
        pna, dpna = self.psi(-a)
        fb, dfb = self.phi(b)
        fnb, dfnb = self.phi(-b)
        f1, df1 = self.phi(z[:, :1])
        loss = float((pna * fnb - pa * fb).sum()) - float(f1.sum())
        grad = np.zeros_like(z)
        grad[:, :1] -= df1
        grad[:, 1:] -= pna * dfnb + pa * dfb
        grad[:, :-1] -= dpna * fnb + dpa * fb
        return weight * loss, weight * grad


HEADS = {
    "cross_entropy": SoftmaxCrossEntropy,
    "margin": Margin,
    "abs": AbsResidual,
    "squared": SquaredResidual,
    "max": MaxHead,
    "pinball": PinballResidual,
    "tridiag": TridiagQuadratic,
    "zero-chain": ZeroChain,
}


def make_head(name: str, **kwargs) -> LossHead:
    try:
        return HEADS[name](**kwargs)
    except KeyError:
        raise ValueError(f"unknown loss head {name!r}: choose one of {', '.join(HEADS)}") from None
