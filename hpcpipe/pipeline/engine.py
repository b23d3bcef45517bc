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
        """Per-item views and slices that do not change between calls (built once)."""
        st, M = self.stage, self.microbatches
        self._items = [
            (i // M, self.rows[i % M][0], self.rows[i % M][1]) for i in range(self.n_items)
        ]
        bx, bt = self.batch.x, self.batch.targets
        self._x_rows = [bx[r0:r1] for r0, r1 in self.rows]
        self._t_rows = [bt[r0:r1] for r0, r1 in self.rows]

        def views(ch):
            if ch is None:
                return None, None
            return (
                [ch.payload(i) for i in range(self.n_items)],
                [ch.slots[i] for i in range(self.n_items)],
            )

        self._rf, self._rf_slot = views(self.recv_f)
        self._rb, self._rb_slot = views(self.recv_b)
        self._sf, self._sf_slot = views(self.send_f)
        self._sb, self._sb_slot = views(self.send_b)
        self._ev_lists = tuple([0.0] * len(self.codes) for _ in range(3))
        self._point = np.zeros(self.local_size)
        self._grad = np.zeros(self.local_size)
        if self.variable == "weights":
            self._point_views = st.views(self._point)
            self._grad_views = st.views(self._grad)
        else:
            self._point_views = st.views(st.flat)
            self._grad_views = None

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
        if not hasattr(self, "_items"):
            self._prepare()
        st, M, m = self.stage, self.microbatches, self.batch.m
        first, last = st.is_first, st.is_last
        layers, head = st.layers, st.head
        weights_var = self.variable == "weights"
        input_var = self.variable == "input" and first
        np.copyto(self._point, point)
        point = self._point
        grad = self._grad
        grad[:] = 0.0
        gviews = self._grad_views
        base = self._point_views
        delta = point.reshape(m, self.spec.d_in) if input_var else None
        gdelta = grad.reshape(m, self.spec.d_in) if input_var else None
        params: dict[int, list] = {}
        inputs: dict[int, np.ndarray] = {}
        left: dict[int, int] = {}
        caches: dict[int, list] = {}
        seeds: dict[int, np.ndarray] = {}
        clock, ev, waiter = self.clock, self.events, self.waiter
        ev_wait, ev_ready, ev_end = self._ev_lists
        now, receive, compute = clock.now, clock.receive, clock.compute
        watch = waiter.timeout > 0
        emulate = self.layer_time > 0
        items, x_rows, t_rows = self._items, self._x_rows, self._t_rows
        rf, rf_slot, rb, rb_slot = self._rf, self._rf_slot, self._rb, self._rb_slot
        sf, sf_slot, sb, sb_slot = self._sf, self._sf_slot, self._sb, self._sb_slot
        item_losses = self.item_losses
        item_losses[:] = 0.0
        inv_m = 1.0 / m

        # only the model clock reads message stamps and counts compute; the wall
        # clock and timing-off skip those calls, and a busy wait calls MPI directly
        model = isinstance(clock, ModelClock)
        direct = waiter.policy == "busy" and not watch

        def take(ch, views, slots, i, what, peer):
            """Wait for item i's message, advance the clock, return its payload view."""
            if direct:
                ch.requests[i].Wait()
            elif watch:
                waiter.wait(
                    ch.requests[i],
                    f"rank {self.rank} waits for the {what} of item "
                    f"{i} from rank {peer} (call {call})",
                )
            else:
                waiter.wait(ch.requests[i])
            if model:
                receive(slots[i][-1], ch.nbytes(i))
            return views[i]

        def give(ch, views, slots, i, data, stamp):
            """Copy item i's data into its send slot with the clock stamp; start the send."""
            np.copyto(views[i], data)
            slots[i][-1] = stamp
            ch.requests[i].Start()

        clock.reset()
        MPI.Prequest.Startall(self._recvs)
        t_first = now()
        for idx, (i, kind) in enumerate(self._items_kinds):
            k, r0, r1 = items[i]
            ev_wait[idx] = now()
            if kind == FORWARD:  # forward of item i
                if k not in params:
                    if weights_var and gamma != 0.0:
                        params[k] = st.views(st.perturbed(point, gamma, self.seed, call, k))
                    else:
                        params[k] = base
                    left[k] = M
                    if input_var:
                        x0 = self.batch.x + delta
                        if gamma != 0.0:
                            x0 = x0 + gamma * rng.noise(
                                self.seed, call, rng.INPUT_PARAM_ID, k, x0.shape
                            )
                        inputs[k] = x0
                if first:
                    x = inputs[k][r0:r1] if input_var else x_rows[i % M]
                else:
                    x = take(self.recv_f, rf, rf_slot, i, "activation", self.rank - 1)
                ev_ready[idx] = now()
                y, caches[i] = forward_layers(layers, x, params[k])
                if last:
                    loss, dz = head(y, t_rows[i % M], inv_m)
                    item_losses[i] = loss
                    seeds[i] = dz
                if emulate:
                    self._emulate()
                if model:
                    compute("F")
                t_end = now()
                if not last:
                    give(self.send_f, sf, sf_slot, i, y, t_end)
            else:  # backward of item i
                if last:
                    dy = seeds.pop(i)
                else:
                    dy = take(self.recv_b, rb, rb_slot, i, "gradient", self.rank + 1)
                ev_ready[idx] = now()
                dx = backward_layers(layers, dy, caches.pop(i), params[k], gviews)
                if input_var:
                    gdelta[r0:r1] += dx
                if emulate:
                    self._emulate()
                if model:
                    compute("B")
                t_end = now()
                if not first:
                    give(self.send_b, sb, sb_slot, i, dx, t_end)
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
        if reduce == "mean":
            grad /= self.samples
        comm = self.comm
        if self.size > 1:
            comm.Bcast([item_losses, MPI.DOUBLE], root=self.size - 1)
            self._tbuf[0], self._tbuf[1] = -t_first, ev[-1, EV_END] if len(ev) else t_first
            comm.Allreduce(MPI.IN_PLACE, [self._tbuf, MPI.DOUBLE], op=MPI.MAX)
            elapsed = self._tbuf[1] + self._tbuf[0]
        else:
            elapsed = (ev[-1, EV_END] if len(ev) else t_first) - t_first
        losses = item_losses.reshape(self.samples, M).sum(axis=1)
        return OracleResult(losses, item_losses.copy(), grad.copy(), float(elapsed))
