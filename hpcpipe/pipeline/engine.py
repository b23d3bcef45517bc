"""The MPI engine: runs a schedule to evaluate loss and gradient at n work items.

One oracle call evaluates, for K samples and M microbatches (n = K·M work
items, item i = (sample k = i // M, microbatch j = i % M)),

    f_k = (1/m) Σ_{examples e} ℓ(h_Δ ∘ … ∘ h_1(x_e; θ + γ Z_k), y_e)

and the gradient Σ_k ∇f_k (``reduce="sum"``) or (1/K) Σ_k ∇f_k
(``reduce="mean"``, the PPRS estimate of ∇f_γ). Z_k is drawn by the owner
of each parameter from the counter-based stream (seed, call, parameter, k),
so the numbers do not depend on the partition. The variable θ is the input
perturbation δ (owned by stage 0, shape (m, d_in)) or the weights (each stage
owns its own).

Each rank holds one stage. The engine walks the stage's action list; the
only blocking points are waits on the receive of an action's input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from hpcpipe.model import rng
from hpcpipe.model.layers import backward_layers, forward_layers
from hpcpipe.model.stages import (
    VARIABLES,
    Batch,
    Model,
    Stage,
    microbatch_bounds,
    partition,
    stage_offsets,
)
from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.clocks import CostModel, ModelClock, NoClock, WallClock, align_wall_clocks
from hpcpipe.pipeline.transport import BWD, FWD, Channel, Waiter, tag

FORWARD = int(schedules.Kind.FORWARD)
GATHER_LIMIT = 4096  # doubles gathered at the end of a call before two collectives are cheaper

# columns of the per-action event table of one call
EV_WAIT, EV_READY, EV_END = 0, 1, 2


@dataclass
class OracleResult:
    """What one call returns on every rank.

    losses: f_k per sample (K,), identical on all ranks; item_losses (n,);
    grad: this rank's part of the gradient (same layout as the point);
    time: pipeline time of the call (max end − min start over ranks, on the
    engine's clock).
    """

    losses: np.ndarray
    item_losses: np.ndarray
    grad: np.ndarray
    time: float

    @property
    def loss(self) -> float:
        """Mean over samples of f_k."""
        return float(self.losses.mean())


class Engine:
    """One stage of a pipeline on one MPI rank, executing a schedule per call."""

    def __init__(
        self,
        comm,
        spec: Model,
        batch: Batch,
        variable: str = "input",
        schedule: str | schedules.Schedule = "gpipe",
        samples: int = 1,
        microbatches: int = 1,
        seed: int = 0,
        clock: str = "wall",
        costs: CostModel | None = None,
        wait: str = "auto",
        layer_time: float = 0.0,
        spin: bool = False,
        weights: np.ndarray | None = None,
        timeout: float = 0.0,
    ):
        if variable not in VARIABLES:
            raise ValueError(f"variable {variable!r}: choose one of {', '.join(VARIABLES)}")
        if samples < 1:
            raise ValueError(f"samples (K) must be >= 1, got {samples}")
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.spec, self.batch, self.variable = spec, batch, variable
        self.samples, self.microbatches, self.seed = samples, microbatches, seed
        self.n_items = samples * microbatches
        self.rows = microbatch_bounds(batch.m, microbatches)
        lo, hi = partition(spec.depth, self.size)[self.rank]
        self.stage = Stage(spec, lo, hi, self.rank, self.size)
        if weights is not None:  # e.g. a trained classifier replacing the seeded init
            offs = stage_offsets(spec, self.size)
            self.stage.flat[:] = weights[offs[self.rank] : offs[self.rank + 1]]
        if isinstance(schedule, str):
            schedule = schedules.build(schedule, self.size, self.n_items)
        if schedule.n_stages != self.size or schedule.n_items != self.n_items:
            raise schedules.ScheduleError(
                f"schedule is for {schedule.n_stages} stages x {schedule.n_items} items, "
                f"engine has {self.size} ranks x {self.n_items} items"
            )
        schedule.validate()
        self.schedule = schedule
        self.codes: list[int] = schedule.codes[self.rank].tolist()
        self._items_kinds = list(zip(*schedules.decode_list(schedule.codes[self.rank])))
        self.layer_time = float(layer_time) * (hi - lo)
        self.spin = spin
        self.waiter = Waiter(wait, self.size, timeout=timeout)
        if costs is not None and len(costs.t_forward) != spec.depth:
            raise ValueError(
                f"the cost model covers {len(costs.t_forward)} blocks, the model has "
                f"{spec.depth}: build it with CostModel.uniform(model.depth, ...)"
            )
        if clock == "model":
            self.clock = ModelClock.for_stage(costs or CostModel.uniform(spec.depth, 0.0), lo, hi)
        elif clock == "none":
            self.clock = NoClock()
        elif clock == "wall":
            self.clock = WallClock(
                align_wall_clocks(comm) if self.size > 1 else time.perf_counter()
            )
        else:
            raise ValueError(f"clock {clock!r}: choose wall, model or none")
        self.events = np.zeros((len(self.codes), 3))
        tub = comm.Get_attr(MPI.TAG_UB)
        top = tag(self.n_items - 1, BWD)
        if tub is not None and top > tub:
            raise ValueError(f"{self.n_items} items need tags up to {top} > MPI_TAG_UB {tub}")
        item_rows = [
            self.rows[i % microbatches][1] - self.rows[i % microbatches][0]
            for i in range(self.n_items)
        ]
        st = self.stage
        self.recv_f = self.send_b = self.send_f = self.recv_b = None
        if not st.is_first:
            self.recv_f = Channel(comm, self.rank - 1, FWD, False, item_rows, st.n_in)
            self.send_b = Channel(comm, self.rank - 1, BWD, True, item_rows, st.n_in)
        if not st.is_last:
            self.send_f = Channel(comm, self.rank + 1, FWD, True, item_rows, st.n_out)
            self.recv_b = Channel(comm, self.rank + 1, BWD, False, item_rows, st.n_out)
        self._recvs = [r for ch in (self.recv_f, self.recv_b) if ch for r in ch.requests]
        self._sends = [r for ch in (self.send_f, self.send_b) if ch for r in ch.requests]
        self.item_losses = np.zeros(self.n_items)
        self._tbuf = np.zeros(2)
        # small calls end with one Allgather instead of a Bcast and an Allreduce
        small = (self.n_items + 2) * self.size <= GATHER_LIMIT
        self._gather = (
            (np.zeros(self.n_items + 2), np.zeros((self.size, self.n_items + 2))) if small else None
        )
        self.local_size = (
            (batch.m * spec.d_in if st.is_first else 0) if variable == "input" else st.size
        )

    # ------------------------------------------------------------------
    def initial_point(self) -> np.ndarray:
        """This rank's part of θ₀: δ = 0 (input) or the initial weights."""
        if self.variable == "input":
            return np.zeros(self.local_size)
        return self.stage.flat.copy()

    def close(self) -> None:
        """Free the persistent requests (idempotent); the engine cannot be used afterwards."""
        for ch in (self.recv_f, self.send_b, self.send_f, self.recv_b):
            if ch:
                ch.free()
        self._recvs, self._sends = [], []

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------
    def _emulate(self) -> None:
        if self.layer_time <= 0:
            return
        if self.spin:
            end = time.perf_counter() + self.layer_time
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.layer_time)

    def _prepare(self) -> None:
        """Per-action plan, per-item views and requests that do not change between calls."""
        st, M = self.stage, self.microbatches
        # one tuple per action: (forward?, item, sample, first row, end row, microbatch)
        self._plan = [
            (kind == FORWARD, i, i // M, self.rows[i % M][0], self.rows[i % M][1], i % M)
            for i, kind in self._items_kinds
        ]
        bx, bt = self.batch.x, self.batch.targets
        self._x_rows = [bx[r0:r1] for r0, r1 in self.rows]
        self._t_rows = [bt[r0:r1] for r0, r1 in self.rows]

        def views(ch):
            if ch is None:
                return None, None, None, None
            return (
                [ch.payload(i) for i in range(self.n_items)],
                [ch.slots[i] for i in range(self.n_items)],
                list(ch.requests),
                [ch.nbytes(i) for i in range(self.n_items)],
            )

        self._rf = views(self.recv_f)
        self._rb = views(self.recv_b)
        self._sf = views(self.send_f)
        self._sb = views(self.send_b)
        self._ev_lists = tuple([0.0] * len(self.codes) for _ in range(3))
        self._weight_views = st.views(st.flat)

    def evaluate(
        self, point: np.ndarray, gamma: float = 0.0, call: int = 0, reduce: str = "mean"
    ) -> OracleResult:
        """Run one call of the schedule at ``point`` (this rank's part of θ)."""
        if point.shape != (self.local_size,):
            raise ValueError(
                f"point has shape {point.shape}, this rank expects ({self.local_size},)"
            )
        if reduce not in ("mean", "sum"):
            raise ValueError(f"reduce {reduce!r}: choose mean or sum")
        if not hasattr(self, "_plan"):
            self._prepare()
        st, M, m = self.stage, self.microbatches, self.batch.m
        first, last = st.is_first, st.is_last
        layers, head = st.layers, st.head
        weights_var = self.variable == "weights"
        input_var = self.variable == "input" and first
        # the point is read in place and the gradient is a new array: no copy of either
        point = np.ascontiguousarray(point, dtype=np.float64)
        grad = np.zeros(self.local_size)
        gviews = st.views(grad) if weights_var else None
        base = st.views(point) if weights_var else self._weight_views
        delta = point.reshape(m, self.spec.d_in) if input_var else None
        gdelta = grad.reshape(m, self.spec.d_in) if input_var else None
        # plain: every sample runs at the base parameters and there is no input to build
        plain = not input_var and not (weights_var and gamma != 0.0)
        need_dx = input_var or not first  # the first stage's dL/dx is wanted for δ only
        params: dict[int, list] = {}
        x_plus_delta = None
        inputs: dict[int, np.ndarray] = {}
        left: dict[int, int] = {}
        caches: dict[int, list] = {}
        seeds: dict[int, np.ndarray] = {}
        clock, ev, waiter = self.clock, self.events, self.waiter
        ev_wait, ev_ready, ev_end = self._ev_lists
        tick, receive, compute = clock.tick, clock.receive, clock.compute
        watch = waiter.timeout > 0
        emulate = self.layer_time > 0
        x_rows, t_rows = self._x_rows, self._t_rows
        rf, rf_slot, rf_req, rf_bytes = self._rf
        rb, rb_slot, rb_req, rb_bytes = self._rb
        sf, sf_slot, sf_req, _ = self._sf
        sb, sb_slot, sb_req, _ = self._sb
        copyto = np.copyto
        item_losses = self.item_losses
        item_losses[:] = 0.0
        inv_m = 1.0 / m

        # only the model clock reads message stamps and counts compute; the wall
        # clock and timing-off skip those calls, and a busy wait calls MPI directly
        model = isinstance(clock, ModelClock)
        direct = waiter.policy == "busy" and not watch

        def await_(req, i: int, what: str, peer: int) -> None:
            """Complete item i's receive under the wait policy (and the watchdog)."""
            if watch:
                waiter.wait(
                    req,
                    f"rank {self.rank} waits for the {what} of item {i} from rank {peer} "
                    f"(call {call})",
                )
            else:
                waiter.wait(req)

        clock.reset()
        MPI.Prequest.Startall(self._recvs)
        t_first = tick()
        t_end = t_first
        for idx, (fwd, i, k, r0, r1, j) in enumerate(self._plan):
            ev_wait[idx] = tick()
            if fwd:  # forward of item i
                if plain:
                    p = base
                else:
                    if k not in params:
                        if weights_var and gamma != 0.0:
                            params[k] = st.views(st.perturbed(point, gamma, self.seed, call, k))
                        else:
                            params[k] = base
                        left[k] = M
                        if input_var:
                            if x_plus_delta is None:  # the same for every sample
                                x_plus_delta = self.batch.x + delta
                            x0 = x_plus_delta
                            if gamma != 0.0:
                                x0 = x0 + gamma * rng.noise(
                                    self.seed, call, rng.INPUT_PARAM_ID, k, x0.shape
                                )
                            inputs[k] = x0
                    p = params[k]
                if first:
                    x = inputs[k][r0:r1] if input_var else x_rows[j]
                else:
                    if direct:
                        rf_req[i].Wait()
                    else:
                        await_(rf_req[i], i, "activation", self.rank - 1)
                    if model:
                        receive(rf_slot[i][-1], rf_bytes[i])
                    x = rf[i]
                ev_ready[idx] = tick()
                y, caches[i] = forward_layers(layers, x, p)
                if last:
                    item_losses[i], seeds[i] = head(y, t_rows[j], inv_m)
                if emulate:
                    self._emulate()
                if model:
                    compute("F")
                t_end = tick()
                if not last:
                    copyto(sf[i], y)
                    if model:
                        sf_slot[i][-1] = t_end
                    sf_req[i].Start()
            else:  # backward of item i
                if last:
                    dy = seeds.pop(i)
                else:
                    if direct:
                        rb_req[i].Wait()
                    else:
                        await_(rb_req[i], i, "gradient", self.rank + 1)
                    if model:
                        receive(rb_slot[i][-1], rb_bytes[i])
                    dy = rb[i]
                ev_ready[idx] = tick()
                dx = backward_layers(
                    layers, dy, caches.pop(i), base if plain else params[k], gviews, need_dx
                )
                if input_var:
                    gdelta[r0:r1] += dx
                if emulate:
                    self._emulate()
                if model:
                    compute("B")
                t_end = tick()
                if not first:
                    copyto(sb[i], dx)
                    if model:
                        sb_slot[i][-1] = t_end
                    sb_req[i].Start()
                if not plain:
                    left[k] -= 1
                    if left[k] == 0:
                        del params[k], left[k]
                        inputs.pop(k, None)
            ev_end[idx] = t_end
        if watch:
            waiter.waitall(
                self._sends, f"rank {self.rank} waits for its sends of call {call} to complete"
            )
        else:
            waiter.waitall(self._sends)
        ev[:, EV_WAIT], ev[:, EV_READY], ev[:, EV_END] = ev_wait, ev_ready, ev_end
        origin = clock.origin
        if origin != 0.0:  # the wall clock ticks raw perf_counter seconds
            ev -= origin
            t_first -= origin
        if reduce == "mean" and self.samples > 1:
            grad /= self.samples
        comm = self.comm
        if self.size > 1 and self._gather is not None:
            # one collective: every rank's (−t_first, t_end, losses); the last rank's
            # losses and the max of each time column are the two collectives' results
            mine, every = self._gather
            mine[0], mine[1] = -t_first, ev[-1, EV_END] if len(ev) else t_first
            mine[2:] = item_losses
            comm.Allgather([mine, MPI.DOUBLE], [every, MPI.DOUBLE])
            item_losses[:] = every[-1, 2:]
            elapsed = every[:, 1].max() + every[:, 0].max()
        elif self.size > 1:
            comm.Bcast([item_losses, MPI.DOUBLE], root=self.size - 1)
            self._tbuf[0], self._tbuf[1] = -t_first, ev[-1, EV_END] if len(ev) else t_first
            comm.Allreduce(MPI.IN_PLACE, [self._tbuf, MPI.DOUBLE], op=MPI.MAX)
            elapsed = self._tbuf[1] + self._tbuf[0]
        else:
            elapsed = (ev[-1, EV_END] if len(ev) else t_first) - t_first
        losses = item_losses.reshape(self.samples, M).sum(axis=1)
        return OracleResult(losses, item_losses.copy(), grad, float(elapsed))
