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

Split backward (I, W): I computes the whole backward of the stage (dL/dx,
sent on as B's, and the parameter gradient, accumulated) and W performs no
arithmetic; on the model clock I costs t_I and W costs t_W (``CostModel
.split``), and emulated compute waits the same shares, so the timing is the
schedule's while the gradient is B's exactly. Schedules placing several
stages on one rank run on the simulated executor.
"""

from __future__ import annotations

import functools
import socket
import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from hpcpipe.model import rng
from hpcpipe.model.layers import backward_layers_into, forward_layers_into, load_blas
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
from hpcpipe.pipeline.watchdog import watched

FORWARD = int(schedules.Kind.FORWARD)
INPUT = int(schedules.Kind.INPUT)
WEIGHT = int(schedules.Kind.WEIGHT)
KIND_LETTERS = tuple(k.letter for k in schedules.Kind)
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
        # with the watchdog, every wait on a peer is bounded, collectives too (watchdog.py)
        comm = watched(comm, timeout)
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
        if not schedule.one_stage_per_rank:
            raise schedules.ScheduleError(
                f"schedule {schedule.name!r} places {schedule.n_stages} stages on "
                f"{schedule.n_ranks} ranks; the MPI engine runs one stage per rank: run it "
                "with the simulated executor (executor = simulated)"
            )
        schedule.validate()
        self.schedule = schedule
        self.codes: list[int] = schedule.codes[self.rank].tolist()
        self._items_kinds = list(zip(*schedules.decode_list(schedule.codes[self.rank])))
        self.layer_time = float(layer_time) * (hi - lo)
        share = (costs or CostModel()).weight_share
        # emulated seconds per kind: F and B a layer time each, I and W its shares
        self._layer_times = (
            self.layer_time,
            self.layer_time,
            self.layer_time - self.layer_time * share,
            self.layer_time * share,
        )
        self.spin = spin
        dog = getattr(comm, "watchdog", None)
        self.waiter = Waiter(wait, self.size, timeout=timeout, watchdog=dog)
        # with the watchdog, its report names the peer's host too (a lost node shows by name)
        self.hosts: list[str] = dog.hosts if dog is not None else [socket.gethostname()]
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
        self._plan: list | None = None  # built at the first call (_prepare)
        self._point = self._point_views = None  # the last call's point and its views
        self._events: np.ndarray | None = np.zeros((len(self.codes), 3))  # before any call
        self._readys: list[float] = []
        self._ends: list[float] = []
        self._t_first = 0.0
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
        if variable == "weights":
            load_blas()  # BLAS for the weight gradients, imported now rather than in call 1

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
        self._point = self._point_views = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------
    def _emulate(self, kind: int = FORWARD) -> None:
        seconds = self._layer_times[kind]
        if seconds <= 0:
            return
        if self.spin:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(seconds)

    def _prepare(self) -> None:
        """Per-action plan, per-item views and buffers that do not change between calls.

        One tuple per action: (kind, item, sample, microbatch, first row, end
        row, receive request, input, output, send request); a W has no request,
        input or output. The input is the
        received payload, the batch rows (first stage) or None (built per call:
        the perturbed input δ, or the last stage's loss gradient); the output is
        the send payload (the layers compute into it), a preallocated buffer for
        the last stage's forward, or None (a first stage's backward).
        """
        st, M, n = self.stage, self.microbatches, self.n_items
        first, last = st.is_first, st.is_last
        bx, bt = self.batch.x, self.batch.targets
        self._x_rows = [bx[r0:r1] for r0, r1 in self.rows]
        self._t_rows = [bt[r0:r1] for r0, r1 in self.rows]

        def payloads(ch):
            return [ch.payload(i) for i in range(n)] if ch is not None else [None] * n

        rf, rb, sf, sb = (payloads(c) for c in (self.recv_f, self.recv_b, self.send_f, self.send_b))
        if last:  # the last layer's outputs, read by the head
            sf = [np.zeros((r1 - r0, st.n_out)) for r0, r1 in (self.rows[i % M] for i in range(n))]
        if first and self.variable == "input":  # dL/dx of a microbatch, added into dL/dδ
            dx = [np.zeros((r1 - r0, st.n_in)) for r0, r1 in self.rows]
            sb = [dx[i % M] for i in range(n)]

        def requests(ch):
            return list(ch.requests) if ch is not None else [None] * n

        rf_req, rb_req = requests(self.recv_f), requests(self.recv_b)
        sf_req, sb_req = requests(self.send_f), requests(self.send_b)
        plan = []
        for i, kind in self._items_kinds:
            k, j = divmod(i, M)
            r0, r1 = self.rows[j]
            if kind == FORWARD:
                inp = self._x_rows[j] if first else rf[i]
                plan.append((kind, i, k, j, r0, r1, rf_req[i], inp, sf[i], sf_req[i]))
            elif kind == WEIGHT:
                plan.append((kind, i, k, j, r0, r1, None, None, None, None))
            else:  # B or I
                plan.append((kind, i, k, j, r0, r1, rb_req[i], rb[i], sb[i], sb_req[i]))
        self._plan = plan
        self._slots = tuple(
            (ch.slots, [ch.nbytes(i) for i in range(n)]) if ch is not None else (None, None)
            for ch in (self.recv_f, self.recv_b, self.send_f, self.send_b)
        )
        # the stage's forward / backward into the output buffers; a one-layer stage
        # calls its layer directly (its parameters are then the layer's own list)
        if len(st.layers) == 1:
            self._fwd, self._bwd = st.layers[0].forward_into, st.layers[0].backward_into
            self._own = _first_of
        else:
            layers = st.layers
            self._fwd = functools.partial(forward_layers_into, layers)
            self._bwd = functools.partial(backward_layers_into, layers)
            self._own = _same
        self._base_views = self._own(st.views(st.flat))
        self._seeds: list = [None] * n

    @property
    def events(self) -> np.ndarray:
        """(actions, 3) table of the last call: when each action began to wait for its
        input (the end of the previous action; the start of the call for the first),
        when the input was there, and when it ended (after its send was started), on
        the engine's clock. Built when asked for."""
        if self._events is None:
            readys, ends = self._readys, self._ends
            ev = np.empty((len(ends), 3))
            if len(ends):
                ev[:, EV_READY], ev[:, EV_END] = readys, ends
                ev[0, EV_WAIT] = self._t_first
                ev[1:, EV_WAIT] = ev[:-1, EV_END]
                if self.clock.origin != 0.0:  # the wall clock ticks raw perf_counter seconds
                    ev -= self.clock.origin
            self._events = ev
        return self._events

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
        if self._plan is None:
            self._prepare()
        st, M, m = self.stage, self.microbatches, self.batch.m
        first, last = st.is_first, st.is_last
        weights_var = self.variable == "weights"
        input_var = self.variable == "input" and first
        perturb = weights_var and gamma != 0.0
        own = self._own
        # the point is read in place and the gradient is a new array: no copy of either
        point = np.ascontiguousarray(point, dtype=np.float64)
        grad = np.zeros(self.local_size)
        gviews = own(st.views(grad)) if weights_var else None
        if not weights_var:
            base = self._base_views
        elif point is self._point:  # the array of the last call (e.g. updated in place)
            base = self._point_views
        else:
            base = own(st.views(point))
            self._point, self._point_views = point, base
        gdelta = grad.reshape(m, self.spec.d_in) if input_var else None
        # x + δ, the input of every sample when it is not perturbed
        xk = self.batch.x + point.reshape(m, self.spec.d_in) if input_var else None
        # per sample: parameters or input of its own (made at its first forward, freed
        # after its last backward); otherwise every sample runs the same
        per_sample = perturb or (input_var and gamma != 0.0)
        clock, waiter = self.clock, self.waiter
        tick = clock.tick
        model = isinstance(clock, ModelClock)
        watch = waiter.timeout > 0
        emulate = self.layer_time > 0
        # the common case waits with MPI directly and has nothing to add per action
        direct = waiter.policy == "busy" and not watch and not model
        timed = model or emulate
        fwd_into, bwd_into, head = self._fwd, self._bwd, st.head
        t_rows, seeds = self._t_rows, self._seeds
        item_losses = self.item_losses
        item_losses[:] = 0.0
        inv_m = 1.0 / m
        (rf_slot, rf_bytes), (rb_slot, rb_bytes), (sf_slot, _), (sb_slot, _) = self._slots
        samples: dict[int, tuple] = {}
        left: dict[int, int] = {}
        caches: dict[int, object] = {}

        def receive(req, fwd: bool, i: int) -> None:
            """Complete item i's receive under the wait policy, the watchdog and the clock."""
            if watch:
                what, peer = ("activation", self.rank - 1) if fwd else ("gradient", self.rank + 1)
                waiter.wait(
                    req,
                    f"rank {self.rank} waits for the {what} of item {i} from rank {peer} "
                    f"on {self.hosts[peer]} (call {call})",
                )
            else:
                waiter.wait(req)
            if model:
                if fwd:
                    clock.receive(rf_slot[i][-1], rf_bytes[i])
                else:
                    clock.receive(rb_slot[i][-1], rb_bytes[i])

        def sample(k: int) -> tuple:
            """Sample k's (parameters, input): θ + γZ_k, or x + δ + γZ_k on the first stage."""
            if k not in samples:
                params = base
                if perturb:
                    params = own(st.views(st.perturbed(point, gamma, self.seed, call, k)))
                x0 = xk
                if input_var:
                    x0 = xk + gamma * rng.noise(self.seed, call, rng.INPUT_PARAM_ID, k, xk.shape)
                samples[k], left[k] = (params, x0), M
            return samples[k]

        readys: list[float] = []
        ends: list[float] = []
        ready_add, end_add = readys.append, ends.append
        self._readys, self._ends, self._events = readys, ends, None
        clock.reset()
        MPI.Prequest.Startall(self._recvs)
        t_first = t_end = tick()
        p, xs = base, xk
        for kind, i, k, j, r0, r1, rreq, x, out, sreq in self._plan:
            fwd = kind == FORWARD
            if rreq is not None:
                if direct:
                    rreq.Wait()
                else:
                    receive(rreq, fwd, i)
            ready_add(tick())
            if kind == WEIGHT:  # its arithmetic ran in the I (see the module docstring)
                if timed:
                    if emulate:
                        self._emulate(WEIGHT)
                    if model:
                        clock.compute("W")
                t_end = tick()
                end_add(t_end)
                continue
            if per_sample:
                p, xs = sample(k)
            if fwd:  # forward of item i
                if input_var:
                    x = xs[r0:r1]
                caches[i] = fwd_into(x, p, out)
                if last:
                    item_losses[i], seeds[i] = head(out, t_rows[j], inv_m)
                if timed:
                    if emulate:
                        self._emulate(FORWARD)
                    if model:
                        clock.compute("F")
            else:  # backward of item i
                if last:
                    x, seeds[i] = seeds[i], None
                bwd_into(x, caches.pop(i), p, gviews, out)
                if input_var:
                    gdelta[r0:r1] += out
                if timed:
                    if emulate:
                        self._emulate(kind)
                    if model:
                        clock.compute(KIND_LETTERS[kind])
                if per_sample:
                    left[k] -= 1
                    if left[k] == 0:
                        del samples[k], left[k]
            if sreq is not None:
                if model:  # the message carries its send time
                    (sf_slot if fwd else sb_slot)[i][-1] = tick()
                sreq.Start()
            t_end = tick()
            end_add(t_end)
        if watch:
            waiter.waitall(
                self._sends, f"rank {self.rank} waits for its sends of call {call} to complete"
            )
        else:
            waiter.waitall(self._sends)
        self._t_first = t_first
        origin = clock.origin
        if origin != 0.0:  # the wall clock ticks raw perf_counter seconds
            t_first -= origin
            t_end -= origin
        if reduce == "mean" and self.samples > 1:
            grad /= self.samples
        comm = self.comm
        if self.size > 1 and self._gather is not None:
            # one collective: every rank's (−t_first, t_end, losses); the last rank's
            # losses and the max of each time column are the two collectives' results
            mine, every = self._gather
            mine[0], mine[1] = -t_first, t_end
            mine[2:] = item_losses
            comm.Allgather([mine, MPI.DOUBLE], [every, MPI.DOUBLE])
            item_losses[:] = every[-1, 2:]
            elapsed = every[:, 1].max() + every[:, 0].max()
        elif self.size > 1:
            comm.Bcast([item_losses, MPI.DOUBLE], root=self.size - 1)
            self._tbuf[0], self._tbuf[1] = -t_first, t_end
            comm.Allreduce(MPI.IN_PLACE, [self._tbuf, MPI.DOUBLE], op=MPI.MAX)
            elapsed = self._tbuf[1] + self._tbuf[0]
        else:
            elapsed = t_end - t_first
        losses = item_losses.reshape(self.samples, M).sum(axis=1)
        return OracleResult(losses, item_losses.copy(), grad, float(elapsed))


def _first_of(views: list) -> list:
    """A one-layer stage's parameters: its layer's list."""
    return views[0]


def _same(views: list) -> list:
    return views
