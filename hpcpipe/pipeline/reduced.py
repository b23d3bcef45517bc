"""The reduced route: a deep orthogonal chain timed at its depth, computed on its first blocks.

The executor ``reduced`` is the simulated pipeline (``simulated.py``) of a
built-in Householder chain (``layers = "householder"``, the input as variable)
whose numerics go through the first Δ₀ = ``REDUCED_DEPTH`` block(s) of the chain
instead of all Δ, while every call is timed by the schedule simulator on the Δ
stages of the configured depth. A call's time depends only on (schedule, S, n,
costs, message sizes), never on the values (``simulated.py``), so the pipeline
time is exactly that of the full run; this module states what the values are.

Setting. A convex chain (``problems.chains``, ``problems.worstcase``) is
f_Δ(θ) = g(θQ_Δ) + r(θ) with Q_Δ = Q₁⋯Q_Δ orthogonal (row vectors), a head g and
a regulariser r(θ) = (μ/2)‖θ‖² (or none), θ₀ = 0, no projection. f*, L and R are
those of g + r (QᵀQ = I), so every setting of ``theory_plan`` (T, K, γ, η; and
the tuned step, chosen on a full run) is the same at every Δ.

Claim (exact arithmetic). Let a run on f_Δ use the noise Z_{t,k} ~ N(0, I) at
call t, sample k; GD, AGD and PPRS (AC-SA or plain momentum) update their
iterates by linear combinations, with scalar coefficients that do not depend
on θ, of earlier iterates and of the oracle's answers G = (1/K)Σ_k ∂f_Δ(y + γZ_k).
Then for every t the run's iterates satisfy θ_t Q_Δ = w_t, where w_t is the
run of the same method on g + r (no chain) with noise Z_{t,k} Q_Δ, and the two
runs record the same losses, f and gaps.

Proof, by induction on t. θ₀Q_Δ = 0 = w₀. If y Q_Δ = v, the oracle of f_Δ at
y with noise Z answers the loss g((y + γZ)Q_Δ) + r(y) = g(v + γZQ_Δ) + r(v)
(‖yQ_Δ‖ = ‖y‖), and the subgradient ∂g(v + γZQ_Δ)Q_Δᵀ + μy, whose product with
Q_Δ is ∂g(v + γZQ_Δ) + μv: the answer of g + r at v with noise ZQ_Δ, times Q_Δᵀ.
Linear combinations commute with the product by Q_Δ, so the next iterates
correspond too. ∎ Applied to depth Δ and depth Δ₀ (both compared with g + r),
the run at Δ equals the run at Δ₀ with the noise Z Q_Δ Q_{Δ₀}ᵀ.

* γ = 0 (GD, AGD): no noise, so the run on the first Δ₀ blocks records the same
  losses, f and gaps as the run on all Δ, for every Δ, up to rounding. One
  caveat of floating point: on nesterov-chain the subgradient of max_j z_j is
  taken at a maximiser, and coordinates that are 0 in exact arithmetic are
  O(u‖θ‖) after a product by Q (u the unit roundoff), so ties are broken by
  rounding, differently at different Δ. g is invariant under permutations of
  the chain's coordinates and the methods are equivariant, so the two runs
  differ by a permutation of z's coordinates plus rounding: the recorded values
  agree to rounding (tested: same iterations to ε, losses to 1e-12 relative,
  tests/test_reduced_route.py).
* γ > 0 (PPRS): the reduced run uses the noise Z of the counter-based stream
  (seed, call, parameter, k), where the run at Δ would see Z Q_Δ Q_{Δ₀}ᵀ. The
  runs are therefore NOT equal path by path. Q_Δ Q_{Δ₀}ᵀ is a fixed orthogonal
  matrix (it depends on the seed's layers, not on the noise) and N(0, I) is
  invariant under it, so the noise sequences {Z Q_Δ Q_{Δ₀}ᵀ} and {Z} have the
  same law (i.i.d. N(0, I) over calls and samples): the reduced run's record is
  equal in distribution to the run at Δ, not equal. Tested both ways: with the
  noise rotated by Q_Δ Q_{Δ₀}ᵀ the reduced run equals the full run (losses to
  1e-12), and over seeds the iteration counts of full and reduced runs have
  the same distribution within the test's power.

At Δ ≤ Δ₀ the reduced pipeline computes exactly what the simulated one does
(the same fused evaluation of the same Δ blocks), so a reduced run at any Δ
records bitwise the values of the full run at min(Δ, Δ₀), timed at Δ. A depth
study that uses this route measures one realisation of PPRS per (x, setting)
for every Δ ≥ Δ₀ (that of the full run at Δ₀), where full runs draw an
independent realisation per Δ (each Δ is another Q).
"""

from __future__ import annotations

import hashlib

import numpy as np

from hpcpipe.pipeline.engine import OracleResult
from hpcpipe.pipeline.simulated import SimulatedPipeline

REDUCED_DEPTH = 2  # Δ₀: blocks the numerics of a reduced run go through
MEMO_BYTES = 1 << 30  # answers kept per process (beyond it, answers are computed again)

_MEMO: dict[tuple, tuple[bytes, np.ndarray, np.ndarray, np.ndarray]] = {}
_memo_bytes = 0


def clear_memo() -> None:
    """Forget the kept answers (a study calls it between groups of runs)."""
    global _memo_bytes
    _MEMO.clear()
    _memo_bytes = 0


def _digest(a: np.ndarray) -> bytes:
    """A point's fingerprint for the kept answers (SHA-1: about twice BLAKE2b's speed here,
    20 against 42 us at d = 4096; an accidental match of two points is not a concern)."""
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).digest()


class ReducedPipeline(SimulatedPipeline):
    """The simulated pipeline timed at the spec's depth, computed on its first min(Δ, Δ₀) blocks.

    Its answers do not depend on the depth, so runs of the same problem, method and
    settings at several depths in one process compute each call once: an answer is kept
    under (problem without its depth, batch, K, M, call, γ, reduce) with a digest of
    the point, and returned (with this depth's call time) when the point's digest
    matches; otherwise it is computed. Either way the answer is bitwise what the
    computation gives.
    """

    executor = "reduced"

    def __init__(self, spec, batch, **kw):
        super().__init__(spec, batch, numerics_depth=min(REDUCED_DEPTH, spec.depth), **kw)
        problem = (spec.kind, spec.d_in, spec.d_out, spec.head, repr(spec.head_args), spec.seed)
        self._key = (problem, _digest(batch.x), _digest(batch.targets), self.variable)

    def evaluate(
        self,
        point: np.ndarray,
        gamma: float = 0.0,
        call: int = 0,
        reduce: str = "mean",
        gradient: bool = True,
    ) -> OracleResult:
        """``SimulatedPipeline.evaluate``, each distinct call computed once per process."""
        global _memo_bytes
        key = (*self._key, self.samples, self.microbatches, self.numerics_depth, call, gamma)
        key += (reduce, gradient)
        digest = _digest(point)
        kept = _MEMO.get(key)
        if kept is not None and kept[0] == digest:
            _, losses, items, grad = kept
            return OracleResult(losses.copy(), items.copy(), grad.copy(), self.timing.makespan)
        res = super().evaluate(point, gamma, call, reduce, gradient)
        size = res.losses.nbytes + res.item_losses.nbytes + res.grad.nbytes
        if _memo_bytes + size <= MEMO_BYTES:
            _MEMO[key] = (digest, res.losses.copy(), res.item_losses.copy(), res.grad.copy())
            _memo_bytes += size
        return res


def reduced_pipeline(comm, spec, batch, *, stages: int = 0, **kw) -> ReducedPipeline:
    """The reduced pipeline of ``stages`` stages (default: one per block), timed at the
    spec's depth, its numerics through the first ``REDUCED_DEPTH`` block(s) (module doc)."""
    if comm is not None and comm.size != 1:
        raise ValueError(f"the reduced pipeline runs in one process, not {comm.size} ranks")
    if spec.kind != "householder":
        raise ValueError(
            f"executor = 'reduced' needs layers = 'householder' (got {spec.kind!r} layers): "
            "set layers = 'householder' or executor = 'simulated'"
        )
    for unused in ("clock", "wait", "timeout", "layer_time"):
        kw.pop(unused, None)
    return ReducedPipeline(spec, batch, stages=stages, **kw)


__all__ = ["MEMO_BYTES", "REDUCED_DEPTH", "ReducedPipeline", "clear_memo", "reduced_pipeline"]
