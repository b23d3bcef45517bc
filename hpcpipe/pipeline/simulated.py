"""The simulated pipeline: the MPI engine's oracle in one process, timed by the simulator.

One call evaluates exactly what ``Engine.evaluate`` evaluates (engine.py's
docstring): for K samples and M microbatches (n = K·M work items, item
i = (k = i // M, j = i % M)),

    f_k = (1/m) Σ_e ℓ(h_Δ ∘ … ∘ h_1(x_e; θ + γ Z_k), y_e),
    g = (1/K) Σ_k ∇f_k  (``reduce="mean"``)  or  Σ_k ∇f_k  (``reduce="sum"``),

with the same counter-based noise Z_k (seed, call, parameter, k), so the
numbers are those of the engine on any number of ranks up to rounding (the
sums run in another order: tested to <= 1e-12). The K samples are stacked
and pushed through the layers as one batch when the variable is the input.

A chain of fixed orthogonal blocks composes exactly, h_Δ ∘ … ∘ h_1(x) = xQ
with Q = Q₁⋯Q_Δ (row-vector convention, layers.Orthogonal), and its
backward is dx = dz Qᵀ; ``fused`` builds the d×d map Q once and evaluates
with one product each way instead of Δ (tested equal to the layered
evaluation to <= 1e-12). A built-in chain of Householder layers (``layers =
"householder"``) is fused without forming Q: its rΔ reflectors are applied as
one stack in compact-WY panels (``model.reflectors``), O(Δd) memory and time.

The time of a call is not measured: it is the makespan of the schedule on S
stages under the cost model (t_F, t_B per block summed per stage as the
engine's model clock does, messages α + bytes·β), computed by the
discrete-event simulator (simulator.py), which equals the MPI engine's model
clock bitwise (tests/mpi). It depends only on (schedule, S, n, costs, message
sizes), so it is simulated once per such key and cached, not once per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcpipe.model import rng
from hpcpipe.model.layers import (
    ORTHOGONAL_LAYERS,
    Orthogonal,
    backward_layers,
    forward_layers,
    load_blas,
)
from hpcpipe.model.reflectors import reflector_chain
from hpcpipe.model.stages import (
    VARIABLES,
    Batch,
    ModelSpec,
    Stage,
    microbatch_bounds,
    partition,
)
from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import OracleResult
from hpcpipe.pipeline.simulator import SimResult, message_costs, simulate, stage_times

_VALIDATED: set[tuple[str, int, int]] = set()  # (name, ranks, items) of built-ins validated

# schedules with more actions than this are timed without per-action records
RECORD_LIMIT = 200_000


@dataclass
class Timing:
    """The simulated timing of one call, the same for every call of a run.

    makespan: the call's pipeline time; per rank (= per stage with one stage
    per rank): busy = n(t_F + t_B) summed over its stages, wait = end − busy (a
    rank is either computing or waiting for an input until its last action
    ends), idle = makespan − end; ``result`` holds
    the per-action times when they were asked for (``record=True``, for a
    timeline) and the schedule has at most RECORD_LIMIT actions, else None.
    """

    makespan: float
    busy: np.ndarray
    wait: np.ndarray
    idle: np.ndarray
    actions: np.ndarray
    result: SimResult | None


_TIMINGS: dict[tuple, Timing] = {}


def schedule_timing(
    schedule: schedules.Schedule,
    t_forward: list[float],
    t_backward: list[float],
    message: list[list[float]],
    record: bool = False,
    t_input: list[float] | None = None,
    t_weight: list[float] | None = None,
) -> Timing:
    """Simulate ``schedule`` once for these costs; later calls with the same key reuse it.

    Built-in schedules are keyed by (name, S, n, costs, message costs); a
    schedule object of one's own by its identity. ``record`` asks for the
    per-action times as well (a timeline): the simulator then walks the
    schedule action by action instead of its vectorised kernel, about twice
    the cost at Δ = 4096, so a timing without them is simulated without
    them and re-simulated only if a timeline later asks (both give the same
    makespan bit for bit: ``simulator.simulate``).
    """
    name = schedule.name if schedule.name in schedules.SCHEDULES else id(schedule)
    key = (
        name,
        schedule.n_stages,
        schedule.n_items,
        tuple(t_forward),
        tuple(t_backward),
        tuple(tuple(row) for row in _compress(message)),
        None if t_input is None else tuple(t_input),
        None if t_weight is None else tuple(t_weight),
    )
    record = record and len(schedule) <= RECORD_LIMIT
    hit = _TIMINGS.get(key)
    if hit is not None and (hit.result is not None or not record):
        return hit
    res = simulate(
        schedule, t_forward, t_backward, message, record=record, t_input=t_input, t_weight=t_weight
    )
    end = np.array(res.stage_end)
    busy = np.array(res.busy)
    timing = Timing(
        res.makespan,
        busy,
        end - busy,
        res.makespan - end,
        np.array([len(o) for o in schedule.order], dtype=np.int64),
        res if record else None,
    )
    if hit is None and len(_TIMINGS) >= 64:  # a sweep's configurations, bounded
        _TIMINGS.pop(next(iter(_TIMINGS)))
    _TIMINGS[key] = timing
    return timing


def _compress(message: list[list[float]]) -> list[tuple]:
    """A boundary's message costs as (value,) when all items cost the same (the usual case)."""
    out = []
    for row in message:
        first = row[0] if row else 0.0
        out.append((first,) if all(c == first for c in row) else tuple(row))
    return out


def _shared(message: list[list[float]]) -> list[list[float]]:
    """The same costs with one float object per distinct value (S·n entries stay pointers)."""
    seen: dict[float, float] = {}
    return [[seen.setdefault(c, c) for c in row] for row in message]


def clear_timings() -> None:
    """Forget the cached schedule timings."""
    _TIMINGS.clear()


def is_orthogonal_chain(layers) -> bool:
    """True when every layer is a fixed orthogonal map (the chain composes to one matrix)."""
    return bool(layers) and all(isinstance(layer, ORTHOGONAL_LAYERS) for layer in layers)


def chain_matrix(layers) -> np.ndarray:
    """Q = Q₁⋯Q_Δ of a chain of orthogonal layers (row vectors: x ↦ xQ)."""
    q = np.eye(layers[0].n_in)
    for layer in layers:
        q = q @ layer.q if isinstance(layer, Orthogonal) else layer.forward(q, [])[0]
    return q


# per (seed, d): Q₁⋯Q_D for the depths D kept (prefixes of one another: block b of a
# built-in chain does not depend on Δ)
_CHAINS: dict[tuple[int, int], dict[int, np.ndarray]] = {}
PREFIX_BYTES = 256 * 2**20  # snapshots kept per chain beyond the depths asked for


def _builtin_chain(spec) -> bool:
    return isinstance(spec, ModelSpec) and spec.kind in ("orthogonal", "householder")


def _times_block(q: np.ndarray | None, seed: int, b: int, d: int) -> np.ndarray:
    """q·Q_b (Q_b itself when q is None), with Q_b = H₁⋯H_d·diag(sign r_jj) the
    orthogonal factor of block b's Gaussian matrix (``layers.Orthogonal.init``).

    The Householder reflectors H_j of the QR factorisation (LAPACK dgeqrf) are
    applied to q directly (dormqr) instead of forming Q_b (dorgqr) and then
    multiplying: the same matrix up to rounding, fewer flops (measured in
    the README's depth paragraph). ``q`` is not modified.
    """
    from scipy.linalg import lapack  # the simulated pipeline only: MPI ranks never import it

    a = rng.init_generator(seed, b).standard_normal((d, d))
    qr, tau, _, info = lapack.dgeqrf(a, overwrite_a=True)
    if info != 0:
        raise np.linalg.LinAlgError(f"dgeqrf failed on block {b} (info = {info})")
    c = np.eye(d) if q is None else q
    lwork = int(lapack.dormqr("R", "N", qr, tau, c, -1)[1][0])
    out, _, info = lapack.dormqr("R", "N", qr, tau, c, lwork, overwrite_c=q is None)
    if info != 0:
        raise np.linalg.LinAlgError(f"dormqr failed on block {b} (info = {info})")
    out *= np.sign(np.diag(qr))
    return out


def builtin_chain_matrix(spec: ModelSpec) -> np.ndarray:
    """Q = Q₁⋯Q_Δ of a built-in orthogonal chain, built from its blocks' seeds.

    Block b depends on (seed, b, d) only, so the chain of depth Δ' < Δ is a
    prefix of the chain of depth Δ: the products are kept per (seed, d) at
    every power-of-two depth (while they take at most PREFIX_BYTES) and at
    each depth asked for, and a new depth extends the longest kept prefix
    below it. A depth study's grid Δ = 2, 4, …, 2048 then costs one chain of
    2048 blocks per (seed, d) and process, not one per run. Read-only arrays.
    """
    d, D = spec.d_in, spec.depth
    kept = _CHAINS.get((spec.seed, d))
    if kept is None:
        if len(_CHAINS) >= 4:
            _CHAINS.pop(next(iter(_CHAINS)))
        kept = _CHAINS[(spec.seed, d)] = {}
    if D in kept:
        return kept[D]
    start = max((k for k in kept if k < D), default=0)
    q = kept.get(start)
    room = PREFIX_BYTES // (8 * d * d) - len(kept)
    for b in range(start, D):
        q = _times_block(q, spec.seed, b, d)
        depth = b + 1
        if depth == D or (room > 0 and depth & (depth - 1) == 0):
            q.flags.writeable = False
            kept[depth] = q
            room -= 1
    return q


def clear_chains() -> None:
    """Forget the kept chain products."""
    _CHAINS.clear()


class SimulatedPipeline:
    """A pipeline of ``stages`` stages evaluated in one process, timed by the simulator.

    Same surface as ``Engine``: ``evaluate(point, gamma, call, reduce)``
    returns an ``OracleResult`` (losses, item_losses, grad, time),
    ``initial_point()``, ``schedule``, ``size`` (1: the process holds the
    whole θ), ``n_stages``, ``close()``. ``fused``: "auto" composes an
    orthogonal chain into one matrix, "off" keeps the layers, "on" requires
    a chain that composes.
    """

    executor = "simulated"
    # a call's time is the simulator's makespan: it depends on (schedule, S, n, costs),
    # never on the values, so an answer computed once may serve an equal call (runner)
    timed_by_model = True

    def __init__(
        self,
        spec,
        batch: Batch,
        variable: str = "input",
        schedule: str | schedules.Schedule = "gpipe",
        samples: int = 1,
        microbatches: int = 1,
        seed: int = 0,
        costs: CostModel | None = None,
        stages: int = 0,
        weights: np.ndarray | None = None,
        fused: str = "auto",
        numerics_depth: int = 0,
    ):
        if variable not in VARIABLES:
            raise ValueError(f"variable {variable!r}: choose one of {', '.join(VARIABLES)}")
        if samples < 1:
            raise ValueError(f"samples (K) must be >= 1, got {samples}")
        if fused not in ("auto", "on", "off"):
            raise ValueError(f"fused {fused!r}: choose auto, on or off")
        P = stages or spec.depth  # ranks: a schedule may place several stages on one
        self.spec, self.batch, self.variable, self.seed = spec, batch, variable, seed
        self.samples, self.microbatches = samples, microbatches
        self.n_items = samples * microbatches
        self.rows = microbatch_bounds(batch.m, microbatches)
        # a built-in schedule built from its name is the same every time: validated once
        key = None
        if isinstance(schedule, str):
            key = (schedule, P, self.n_items) if ":" not in schedule else None
            schedule = schedules.build(schedule, P, self.n_items)
        if schedule.n_ranks != P or schedule.n_items != self.n_items:
            raise schedules.ScheduleError(
                f"schedule is for {schedule.n_ranks} ranks x {schedule.n_items} items, "
                f"the simulated pipeline has {P} ranks x {self.n_items} items"
            )
        S = schedule.n_stages
        bounds = partition(spec.depth, S)  # raises PartitionError when S > depth
        self.rank, self.size, self.n_stages = 0, 1, S
        # a built-in orthogonal chain is composed straight from its blocks (cached per
        # process): the layers themselves are never needed
        direct = fused != "off" and variable == "input" and _builtin_chain(spec)
        self.model = None if direct else Stage(spec, 0, spec.depth, 0, 1)
        if weights is not None and self.model is not None:
            self.model.flat[:] = weights
        if key is None or key not in _VALIDATED:
            schedule.validate()
            if key is not None:
                _VALIDATED.add(key)
        self.schedule = schedule
        costs = costs or CostModel.uniform(spec.depth, 0.0)
        if len(costs.t_forward) != spec.depth:
            raise ValueError(
                f"the cost model covers {len(costs.t_forward)} blocks, the model has "
                f"{spec.depth}: build it with CostModel.uniform(depth, ...)"
            )
        self.costs = costs
        tf, tb = stage_times(costs, spec.depth, S)
        dims = spec.dims()
        widths = [dims[hi] for _, hi in bounds[:-1]]
        item_rows = [
            self.rows[i % microbatches][1] - self.rows[i % microbatches][0]
            for i in range(self.n_items)
        ]
        split = [costs.split(t) for t in tb]
        ti, tw = [a for a, _ in split], [b for _, b in split]
        self._timing_args = (tf, tb, _shared(message_costs(costs, widths, item_rows)))
        self._split = (ti, tw)
        self._timing: Timing | None = None
        self.fused = direct or (
            fused != "off" and variable == "input" and is_orthogonal_chain(self.model.layers)
        )
        if fused == "on" and not self.fused:
            raise ValueError("fused = 'on' needs an input variable through an orthogonal chain")
        self._reflectors = None
        # the blocks the numerics go through: all of them, or (the reduced route,
        # pipeline/reduced.py) the first numerics_depth of a Householder chain
        self.numerics_depth = numerics_depth or spec.depth
        if self.numerics_depth != spec.depth and not (
            direct and spec.kind == "householder" and 1 <= self.numerics_depth <= spec.depth
        ):
            raise ValueError(
                f"numerics_depth = {numerics_depth} needs a built-in Householder chain "
                f"evaluated fused (layers = 'householder', input variable) of depth >= it"
            )
        if direct and spec.kind == "householder":
            self._q = None
            self._reflectors = reflector_chain(spec.seed, spec.d_in, self.numerics_depth)
        elif direct:
            self._q = builtin_chain_matrix(spec)
        else:
            self._q = chain_matrix(self.model.layers) if self.fused else None
        self.local_size = batch.m * spec.d_in if variable == "input" else self.model.size
        if variable == "weights":
            load_blas()  # BLAS for the weight gradients, imported now rather than in call 1
        self.head = spec.make_head() if direct else self.model.head

    # ------------------------------------------------------------------
    @property
    def timing(self) -> Timing:
        """The call's simulated timing (simulated on first use, then cached), without
        per-action records: what every call needs (its makespan)."""
        if self._timing is None:
            self._timing = schedule_timing(self.schedule, *self._timing_args, False, *self._split)
        return self._timing

    def recorded_timing(self) -> Timing:
        """The same timing with its per-action records (``Timing.result``; None above
        RECORD_LIMIT actions): asked for only when a timeline is written."""
        if self._timing is None or self._timing.result is None:
            self._timing = schedule_timing(self.schedule, *self._timing_args, True, *self._split)
        return self._timing

    def initial_point(self) -> np.ndarray:
        """θ₀: δ = 0 (input) or the initial weights."""
        if self.variable == "input":
            return np.zeros(self.local_size)
        return self.model.flat.copy()

    def close(self) -> None:
        """Nothing to free (no communicator); kept for the executor surface."""

    def __enter__(self) -> SimulatedPipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------
    def _forward(self, x: np.ndarray, params) -> tuple[np.ndarray, object]:
        if self._q is not None:
            return x @ self._q, None
        if self._reflectors is not None:
            return self._reflectors.forward(x, self.numerics_depth), None
        return forward_layers(self.model.layers, x, params)

    def _backward(self, dz: np.ndarray, cache, params, gviews) -> np.ndarray:
        if self._q is not None:
            return dz @ self._q.T
        if self._reflectors is not None:
            return self._reflectors.backward(dz, self.numerics_depth)
        return backward_layers(self.model.layers, dz, cache, params, gviews)

    def _head(self, z: np.ndarray, k: int, item_losses: np.ndarray) -> np.ndarray:
        """Loss head per item of sample k (z: its m rows); returns dL/dz of those rows."""
        M, t, inv_m = self.microbatches, self.batch.targets, 1.0 / self.batch.m
        dz = np.empty_like(z)
        for j, (r0, r1) in enumerate(self.rows):
            item_losses[k * M + j], dz[r0:r1] = self.head(z[r0:r1], t[r0:r1], inv_m)
        return dz

    def evaluate(
        self,
        point: np.ndarray,
        gamma: float = 0.0,
        call: int = 0,
        reduce: str = "mean",
        gradient: bool = True,
    ) -> OracleResult:
        """Loss and gradient at ``point`` (the whole θ), with the simulated pipeline time.

        ``gradient = False``: the losses only, with no backward pass (``grad`` is empty):
        the same forward pass and heads, so the same losses bitwise, for f(θ) (runner)."""
        if point.shape != (self.local_size,):
            raise ValueError(f"point has shape {point.shape}, expected ({self.local_size},)")
        if reduce not in ("mean", "sum"):
            raise ValueError(f"reduce {reduce!r}: choose mean or sum")
        K = self.samples
        item_losses = np.zeros(self.n_items)
        if self.variable == "input":
            grad = self._input_call(point, gamma, call, item_losses, gradient)
        else:
            grad = self._weights_call(point, gamma, call, item_losses, gradient)
        if reduce == "mean" and gradient:
            grad /= K
        losses = item_losses.reshape(K, self.microbatches).sum(axis=1)
        return OracleResult(losses, item_losses, grad, self.timing.makespan)

    def _input_call(self, point, gamma, call, item_losses, gradient=True) -> np.ndarray:
        """θ = δ: the K perturbed inputs x + δ + γZ_k go through the layers as one batch."""
        K, m, d = self.samples, self.batch.m, self.spec.d_in
        x0 = self.batch.x + point.reshape(m, d)
        xs = np.empty((K, m, d))
        for k in range(K):
            if gamma != 0.0:
                xs[k] = x0 + gamma * rng.noise(self.seed, call, rng.INPUT_PARAM_ID, k, (m, d))
            else:
                xs[k] = x0
        base = None if self.model is None else self.model.views(self.model.flat)
        z, cache = self._forward(xs.reshape(K * m, d), base)
        z = z.reshape(K, m, -1)
        dz = np.empty_like(z)
        for k in range(K):
            dz[k] = self._head(z[k], k, item_losses)
        if not gradient:
            return np.empty(0)
        dx = self._backward(dz.reshape(K * m, -1), cache, base, None)
        return dx.reshape(K, m * d).sum(axis=0)

    def _weights_call(self, point, gamma, call, item_losses, gradient=True) -> np.ndarray:
        """θ = the weights: sample k evaluates the whole batch at θ + γZ_k."""
        mdl = self.model
        grad = np.zeros(self.local_size if gradient else 0)
        gviews = mdl.views(grad) if gradient else None
        for k in range(self.samples):
            params = mdl.views(mdl.perturbed(point, gamma, self.seed, call, k))
            z, cache = self._forward(self.batch.x, params)
            dz = self._head(z, k, item_losses)
            if gradient:
                self._backward(dz, cache, params, gviews)
        return grad


__all__ = [
    "RECORD_LIMIT",
    "SimulatedPipeline",
    "Timing",
    "builtin_chain_matrix",
    "chain_matrix",
    "clear_chains",
    "clear_timings",
    "is_orthogonal_chain",
    "schedule_timing",
]
