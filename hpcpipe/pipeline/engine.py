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

Each rank holds the stages the schedule places on it (one, or several:
interleaved and V placements) and walks its list (``Schedule.order``); the
only blocking points are waits on the receive of an action's input. A
hand-off between two stages of one rank is local: the consumer reads the
producer's output buffer, with no MPI message and no α, β on the model
clock (as ``schedules.walk``). A message between ranks is tagged with its
boundary (link b joins stages b and b + 1) as well as its item and
direction, so a rank holding several stages matches each to its stage.

Split backward (I, W), ``split.splitters``: I computes dL/dx through the
stage and sends it on as B does, stashing each layer's output gradient; W
later accumulates the weight gradient from that stash and the forward's
caches, and frees the item's stash. On the model clock I costs t_I and W
t_W (``CostModel.split``), and emulated compute waits the same shares.

Memory: ``peak_stash`` is the largest number of items whose forward caches
the rank held at once in the last call (an F stashes, a B or W frees), the
quantity ``schedules.peak_stash`` predicts from the lists.
"""

from __future__ import annotations

import functools
import math
import socket
import time
from typing import NamedTuple

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
from hpcpipe.pipeline.split import splitters
from hpcpipe.pipeline.transport import BWD, FWD, Channel, Waiter, tag
from hpcpipe.pipeline.watchdog import watched

FORWARD = int(schedules.Kind.FORWARD)
INPUT = int(schedules.Kind.INPUT)
WEIGHT = int(schedules.Kind.WEIGHT)
KIND_LETTERS = tuple(k.letter for k in schedules.Kind)
GATHER_LIMIT = 4096  # doubles gathered at the end of a call before two collectives are cheaper

# columns of the per-action event table of one call
EV_WAIT, EV_READY, EV_END = 0, 1, 2


class Extras(NamedTuple):
    """What only the model clock, the watchdog, emulated compute, smoothing and the input
    variable read of an action (``Engine._prepare``)."""

    sample: int  # k = item // M
    row0: int  # the microbatch's rows in the batch: [row0, row1)
    row1: int
    recv_slot: np.ndarray | None  # the received message (its last float: the send stamp)
    recv_bytes: int  # the message's payload bytes (the model clock's β term)
    peer: int  # the rank it comes from (-1: none)
    send_slot: np.ndarray | None  # the sent message (its last float: the send stamp)
    cost: float  # model seconds of the action
    emulated: float  # emulated seconds of the action


class OracleResult:
    """What one call returns on every rank.

    losses: f_k per sample (K,), identical on all ranks; item_losses (n,);
    grad: this rank's part of the gradient (same layout as the point);
    time: pipeline time of the call (max end − min start over ranks, on the
    engine's clock).

    ``losses`` None means: the sums over each sample's M item losses
    (``np.add.reduce`` over rows of K × M, bitwise what the engine computed
    before), formed when first read, so that a training step whose caller
    reads only the gradient does not pay for them at the end of every call.
    """

    __slots__ = ("_losses", "_samples", "grad", "item_losses", "time")

    def __init__(
        self,
        losses: np.ndarray | None,
        item_losses: np.ndarray,
        grad: np.ndarray,
        time: float,
        samples: int = 1,
    ):
        self._losses, self._samples = losses, samples
        self.item_losses, self.grad, self.time = item_losses, grad, time

    @property
    def losses(self) -> np.ndarray:
        if self._losses is None:
            items = self.item_losses.reshape(self._samples, -1)
            self._losses = np.add.reduce(items, axis=1)
        return self._losses

    def __repr__(self) -> str:
        return f"OracleResult(loss={self.loss!r}, time={self.time!r})"

    @property
    def loss(self) -> float:
        """Mean over samples of f_k (the sum, then one division: numpy's mean, bitwise)."""
        return float(self.losses.sum()) / self.losses.size


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
        if isinstance(schedule, str):
            schedule = schedules.build(schedule, self.size, self.n_items)
        if schedule.n_ranks != self.size or schedule.n_items != self.n_items:
            raise schedules.ScheduleError(
                f"schedule is for {schedule.n_ranks} ranks x {schedule.n_items} items, "
                f"engine has {self.size} ranks x {self.n_items} items"
            )
        schedule.validate()
        self.schedule = schedule
        S = schedule.n_stages
        placement = schedule.placement
        self.placement = placement
        bounds = partition(spec.depth, S)
        # this rank's stages, in stage order; u indexes them ("local stage")
        self.local_stages = [s for s in range(S) if placement[s] == self.rank]
        if not self.local_stages:
            raise schedules.ScheduleError(
                f"schedule {schedule.name!r} places no stage on rank {self.rank}"
            )
        self.stages = [Stage(spec, *bounds[s], s, S) for s in self.local_stages]
        self.stage = self.stages[0]  # the rank's first stage (its only one in the classic case)
        self._local = {s: u for u, s in enumerate(self.local_stages)}
        sizes = [st.size for st in self.stages]
        self._param_offs = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        if weights is not None:  # e.g. a trained classifier replacing the seeded init
            offs = stage_offsets(spec, S)
            for s, st in zip(self.local_stages, self.stages):
                st.flat[:] = weights[offs[s] : offs[s + 1]]
        n_loc = schedules.n_codes(self.n_items)
        order = schedule.order[self.rank]
        self._placed = list(
            zip(
                schedules.stages_of(order, self.n_items).tolist(),
                schedules.items(order % n_loc).tolist(),
                schedules.kinds(order % n_loc).tolist(),
            )
        )
        self.codes: list[int] = schedules.codes_of(order, self.n_items).tolist()
        self.action_stages: list[int] = [s for s, _, _ in self._placed]
        costs_model = costs or CostModel()
        share = costs_model.weight_share
        # emulated seconds per local stage and kind: F and B a layer time per block,
        # I and W its shares
        self._layer_times = []
        for st in self.stages:
            lt = float(layer_time) * (st.hi - st.lo)
            self._layer_times.append((lt, lt, lt - lt * share, lt * share))
        self.layer_time = max((t[0] for t in self._layer_times), default=0.0)
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
        lo, hi = self.stage.lo, self.stage.hi
        if clock == "model":
            cm = costs or CostModel.uniform(spec.depth, 0.0)
            self.clock = ModelClock.for_stage(cm, lo, hi)
            # model seconds per local stage and kind (F, B, I, W), as ModelClock.for_stage
            self._model_costs = []
            for st in self.stages:
                tf, tb = cm.stage_costs(st.lo, st.hi)
                ti, tw = cm.split(tb)
                self._model_costs.append((float(tf), float(tb), float(ti), float(tw)))
        elif clock == "none":
            self.clock = NoClock()
        elif clock == "wall":
            self.clock = WallClock(
                align_wall_clocks(comm) if self.size > 1 else time.perf_counter()
            )
        else:
            raise ValueError(f"clock {clock!r}: choose wall, model or none")
        if clock != "model":
            self._model_costs = [(0.0,) * 4 for _ in self.stages]
        self._plan: list | None = None  # built at the first call (_prepare)
        self._point = self._point_views = None  # the last call's point and its views
        self._events: np.ndarray | None = np.zeros((len(self.codes), 3))  # before any call
        self._readys: list[float] = []
        self._ends: list[float] = []
        self._t_first = 0.0
        self.peak_stash = 0
        # several stages per rank: a message's tag names its boundary as well
        self._tag_stride = 0 if schedule.one_stage_per_rank else n_loc
        tub = comm.Get_attr(MPI.TAG_UB)
        top = self._tag_stride * max(S - 2, 0) + tag(self.n_items - 1, BWD)
        if tub is not None and top > tub:
            raise ValueError(f"{self.n_items} items need tags up to {top} > MPI_TAG_UB {tub}")
        item_rows = [
            self.rows[i % microbatches][1] - self.rows[i % microbatches][0]
            for i in range(self.n_items)
        ]
        self._item_rows = item_rows
        # channels per local stage: (recv_f, send_b) towards stage s − 1 and (send_f,
        # recv_b) towards stage s + 1 when that stage is on another rank, else None
        self._channels: list[tuple] = []
        for s, st in zip(self.local_stages, self.stages):
            rf = sb = sf = rb = None
            if s > 0 and placement[s - 1] != self.rank:
                peer, base = placement[s - 1], self._tag_stride * (s - 1)
                rf = Channel(comm, peer, FWD, False, item_rows, st.n_in, base)
                sb = Channel(comm, peer, BWD, True, item_rows, st.n_in, base)
            if s < S - 1 and placement[s + 1] != self.rank:
                peer, base = placement[s + 1], self._tag_stride * s
                sf = Channel(comm, peer, FWD, True, item_rows, st.n_out, base)
                rb = Channel(comm, peer, BWD, False, item_rows, st.n_out, base)
            self._channels.append((rf, rb, sf, sb))
        chans = [ch for group in self._channels for ch in group if ch is not None]
        self.recv_f, self.recv_b, self.send_f, self.send_b = self._channels[0]
        self._recvs = [r for group in self._channels for ch in group[:2] if ch for r in ch.requests]
        self._sends = [r for group in self._channels for ch in group[2:] if ch for r in ch.requests]
        self._all_channels = chans
        self._tbuf = np.zeros(2)
        self._gather_req = None
        # small calls end with one Allgather instead of a Bcast and an Allreduce: this
        # rank's (−t_first, t_end, item losses) in one buffer, the item losses a view of
        # it that the last stage's forwards write into, so nothing is copied in
        small = (self.n_items + 2) * self.size <= GATHER_LIMIT
        self._gather = None
        if small:
            mine, every = np.zeros(self.n_items + 2), np.zeros((self.size, self.n_items + 2))
            self.item_losses = mine[2:]
            # the last stage's losses and every rank's t_end, as views of the result
            ends, losses = every[:, 1], every[placement[S - 1], 2:]
            self._gather = ([mine, MPI.DOUBLE], [every, MPI.DOUBLE], mine, every, losses, ends)
            if self.size > 1 and isinstance(comm, MPI.Comm):  # not under the watchdog
                self._gather_req = _persistent_allgather(comm, *self._gather[:2])
        else:
            self.item_losses = np.zeros(self.n_items)
        self.holds_first = self.local_stages[0] == 0
        self.holds_last = self.local_stages[-1] == S - 1
        self.last_rank = placement[S - 1]
        self.first_rank = placement[0]
        if variable == "input":
            self.local_size = batch.m * spec.d_in if self.holds_first else 0
        else:
            self.local_size = self._param_offs[-1]
        self._point_shape = (self.local_size,)
        self._weights_var = variable == "weights"
        self._input_var = variable == "input" and self.holds_first
        if variable == "weights":
            load_blas()  # BLAS for the weight gradients, imported now rather than in call 1

    # ------------------------------------------------------------------
    def initial_point(self) -> np.ndarray:
        """This rank's part of θ₀: δ = 0 (input) or the initial weights of its stages
        (concatenated in stage order)."""
        if self.variable == "input":
            return np.zeros(self.local_size)
        return np.concatenate([st.flat for st in self.stages])

    def close(self) -> None:
        """Free the persistent requests (idempotent); the engine cannot be used afterwards."""
        for ch in self._all_channels:
            ch.free()
        if self._gather_req is not None:
            self._gather_req.Free()
            self._gather_req = None
        self._all_channels = []
        self._recvs, self._sends = [], []
        self._point = self._point_views = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------
    def _emulate(self, kind: int = FORWARD, u: int = 0) -> None:
        seconds = self._layer_times[u][kind]
        if seconds <= 0:
            return
        if self.spin:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(seconds)

    def _local_views(self, vec: np.ndarray) -> list:
        """Per local stage, the parameter views of this rank's part of θ (or of a gradient)."""
        # Stage.views with each stage's offset folded into its spans (made by _prepare);
        # the size of ``vec`` is checked by ``evaluate``
        return [
            own([[vec[a:b].reshape(s) for a, b, s in spans] for spans in layers])
            for own, layers in self._spans
        ]

    def _prepare(self) -> None:
        """Per-action plan, per-item views and buffers that do not change between calls.

        One tuple per action, what every call reads: (kind, item, stash key,
        receive request, input, output, send request, its function, local
        stage, targets, input-variable flag, ``Extras``), the extras being what
        only the model clock, the watchdog, emulated compute, smoothing and the
        input variable read. The input is the received payload, the producer's
        output buffer (a hand-off from a stage of this rank), the batch rows
        (first stage) or None (built per call: the perturbed input δ, or the last
        stage's loss gradient); the output is the send payload (the layers
        compute into it), a buffer of its own (the last stage's forward, a local
        hand-off), or None (a first stage's backward when the input is not the
        variable). The targets are the microbatch's rows on the last stage (its
        forward applies the head, its backward starts from the head's gradient),
        else None.
        """
        M, n, S = self.microbatches, self.n_items, self.schedule.n_stages
        bx, bt = self.batch.x, self.batch.targets
        self._x_rows = [bx[r0:r1] for r0, r1 in self.rows]
        self._t_rows = [bt[r0:r1] for r0, r1 in self.rows]
        rows = [self.rows[i % M] for i in range(n)]

        def payloads(ch):
            return [ch.payload(i) for i in range(n)] if ch is not None else None

        def requests(ch):
            return list(ch.requests) if ch is not None else [None] * n

        def stamps(ch):
            if ch is None:
                return [None] * n, [0] * n
            return ch.slots, [ch.nbytes(i) for i in range(n)]

        # per local stage: forward output (sf) and backward output (sb) buffers
        outs_f, outs_b = [], []
        for u, (s, st) in enumerate(zip(self.local_stages, self.stages)):
            rf, rb, sf, sb = self._channels[u]
            of = payloads(sf)
            if of is None:  # last stage, or a local hand-off: buffers of its own
                of = [np.zeros((r1 - r0, st.n_out)) for r0, r1 in rows]
            ob = payloads(sb)
            if ob is None:
                if s == 0 and self.variable == "input":  # dL/dx of a microbatch, added into dL/dδ
                    dx = [np.zeros((r1 - r0, st.n_in)) for r0, r1 in self.rows]
                    ob = [dx[i % M] for i in range(n)]
                elif s > 0:  # a local hand-off to stage s − 1
                    ob = [np.zeros((r1 - r0, st.n_in)) for r0, r1 in rows]
                else:
                    ob = [None] * n
            outs_f.append(of)
            outs_b.append(ob)
        self._owns = []
        self._fwds, self._bwds, self._inputs, self._weights = [], [], [], []
        for st in self.stages:
            # the stage's forward / backward into the output buffers; a one-layer stage
            # calls its layer directly (its parameters are then the layer's own list)
            single = len(st.layers) == 1
            if single:
                self._fwds.append(st.layers[0].forward_into)
                self._bwds.append(st.layers[0].backward_into)
                self._owns.append(_first_of)
            else:
                self._fwds.append(functools.partial(forward_layers_into, st.layers))
                self._bwds.append(functools.partial(backward_layers_into, st.layers))
                self._owns.append(_same)
            i_fun, w_fun = splitters(st.layers, single)
            self._inputs.append(i_fun)
            self._weights.append(w_fun)
        offs = self._param_offs
        self._spans = [
            (own, [[(a + offs[u], b + offs[u], sh) for a, b, sh in sp] for sp in st._spans])
            for u, (st, own) in enumerate(zip(self.stages, self._owns))
        ]
        plan = []
        for s, i, kind in self._placed:
            u = self._local[s]
            rf, rb, sf, sb = self._channels[u]
            k, j = divmod(i, M)
            r0, r1 = self.rows[j]
            st = self.stages[u]
            cost = self._model_costs[u][kind]
            emu = self._layer_times[u][kind]
            flags = (s == 0, s == S - 1)
            if kind == FORWARD:
                if s == 0:
                    inp, rreq, rslot, rbytes, peer = self._x_rows[j], None, None, 0, -1
                elif rf is None:  # the activation of stage s − 1 on this rank
                    inp = outs_f[self._local[s - 1]][i]
                    rreq, rslot, rbytes, peer = None, None, 0, -1
                else:
                    slots, nb = stamps(rf)
                    inp, rreq, rslot, rbytes = rf.payload(i), rf.requests[i], slots[i], nb[i]
                    peer = self.placement[s - 1]
                sreq = requests(sf)[i]
                sslot = sf.slots[i] if sf is not None else None
                out = outs_f[u][i]
                fun = self._fwds[u]
            elif kind == WEIGHT:
                inp = rreq = rslot = sreq = sslot = out = None
                rbytes, peer = 0, -1
                fun = self._weights[u]
            else:  # B or I
                if s == S - 1:
                    inp, rreq, rslot, rbytes, peer = None, None, None, 0, -1
                elif rb is None:  # the gradient of stage s + 1 on this rank
                    inp = outs_b[self._local[s + 1]][i]
                    rreq, rslot, rbytes, peer = None, None, 0, -1
                else:
                    slots, nb = stamps(rb)
                    inp, rreq, rslot, rbytes = rb.payload(i), rb.requests[i], slots[i], nb[i]
                    peer = self.placement[s + 1]
                sreq = requests(sb)[i]
                sslot = sb.slots[i] if sb is not None else None
                out = outs_b[u][i]
                fun = self._bwds[u] if kind != INPUT else self._inputs[u]
            del st
            tgt = self._t_rows[j] if flags[1] else None
            xin = flags[0] and self._input_var
            rest = Extras(k, r0, r1, rslot, rbytes, peer, sslot, cost, emu)
            plan.append((kind, i, u * n + i, rreq, inp, out, sreq, fun, u, tgt, xin, rest))
        self._plan = plan
        self._receiving = np.array([a for a, row in enumerate(plan) if row[3] is not None], int)
        self._base_views = [own(st.views(st.flat)) for st, own in zip(self.stages, self._owns)]
        self._seeds: list = [None] * n
        watch = self.waiter.timeout > 0
        model = isinstance(self.clock, ModelClock)
        # the common case waits with MPI directly and has nothing to add per action
        direct = self.waiter.policy == "busy" and not watch and not model
        self._modes = (direct, model, watch, model or self.layer_time > 0)
        self._head = (self.stages[-1].head, 1.0 / self.batch.m, self._seeds)
        # the gradient buffer and its views, zeroed at each call; a call returns a copy
        self._grad = np.zeros(self.local_size)
        self._grad_views = (
            self._local_views(self._grad) if self._weights_var else [None] * len(self.stages)
        )
        if self._input_var:
            self._gdelta = self._grad.reshape(self.batch.m, self.spec.d_in)

    @property
    def events(self) -> np.ndarray:
        """(actions, 3) table of the last call: when each action began to wait for its
        input (the end of the previous action; the start of the call for the first),
        when the input was there (its receive completed; at once, so the same reading,
        for an action that receives no message), and when it ended (after its send was
        started), on the engine's clock. Built when asked for."""
        if self._events is None:
            # the call keeps the ready reading of the actions that receive, in plan order
            readys, ends = self._readys, self._ends
            ev = np.empty((len(ends), 3))
            if len(ends):
                ev[:, EV_END] = ends
                ev[0, EV_WAIT] = self._t_first
                ev[1:, EV_WAIT] = ev[:-1, EV_END]
                ev[:, EV_READY] = ev[:, EV_WAIT]
                at = self._receiving[: len(readys)]
                done = at < len(ends)
                ev[at[done], EV_READY] = np.asarray(readys)[done]
                if self.clock.origin != 0.0:  # the wall clock ticks raw perf_counter seconds
                    ev -= self.clock.origin
            self._events = ev
        return self._events

    def evaluate(
        self, point: np.ndarray, gamma: float = 0.0, call: int = 0, reduce: str = "mean"
    ) -> OracleResult:
        """Run one call of the schedule at ``point`` (this rank's part of θ)."""
        if point.shape != self._point_shape:
            raise ValueError(
                f"point has shape {point.shape}, this rank expects ({self.local_size},)"
            )
        if reduce != "mean" and reduce != "sum":
            raise ValueError(f"reduce {reduce!r}: choose mean or sum")
        if self._plan is None:
            self._prepare()
        weights_var, input_var = self._weights_var, self._input_var
        perturb = weights_var and gamma != 0.0
        stages = self.stages
        # the point is read in place; the gradient accumulates in the engine's buffer
        # through views made once (_prepare), and the call returns a copy of it
        point = np.ascontiguousarray(point, dtype=np.float64)
        grad = self._grad
        grad.fill(0.0)
        gviews = self._grad_views
        if not weights_var:
            base = self._base_views
        elif point is self._point:  # the array of the last call (e.g. updated in place)
            base = self._point_views
        else:
            base = self._local_views(point)
            self._point, self._point_views = point, base
        gdelta = xk = None
        if input_var:  # x + δ, the input of every sample when it is not perturbed
            gdelta = self._gdelta
            xk = self.batch.x + point.reshape(gdelta.shape)
        # per sample: parameters or input of its own (made at its first forward, freed
        # after its last backward or W on every stage); otherwise every sample runs the same
        per_sample = perturb or (input_var and gamma != 0.0)
        clock, waiter = self.clock, self.waiter
        tick = clock.tick
        direct, model, watch, timed = self._modes
        head, inv_m, seeds = self._head
        item_losses = self.item_losses  # the last stage's forwards write every item's loss
        caches: dict[int, object] = {}
        stashes: dict[int, object] = {}  # I's output gradients, for its W
        peak = 0

        def receive(req, kind: int, i: int, rest: tuple) -> None:
            """Complete item i's receive under the wait policy and the watchdog; on the
            model clock the message's arrival is its send stamp plus α + β·bytes."""
            if watch:
                what = "activation" if kind == FORWARD else "gradient"
                peer = rest.peer
                waiter.wait(
                    req,
                    f"rank {self.rank} waits for the {what} of item {i} from rank {peer} "
                    f"on {self.hosts[peer]} (call {call})",
                )
            else:
                waiter.wait(req)
            if model:
                clock.receive(rest.recv_slot[-1], rest.recv_bytes)

        if per_sample:
            samples: dict[int, tuple] = {}
            left: dict[int, int] = {}
            per_item = self.microbatches * len(stages)  # actions that free a stash, per sample

            def sample(k: int) -> tuple:
                """Sample k's (parameters per local stage, input): θ + γZ_k, or x + δ + γZ_k
                on the first stage."""
                if k not in samples:
                    params = base
                    if perturb:
                        offs = self._param_offs
                        params = [
                            own(st.views(st.perturbed(point[offs[u] : offs[u + 1]], gamma,
                                                      self.seed, call, k)))
                            for u, (st, own) in enumerate(zip(stages, self._owns))
                        ]  # fmt: skip
                    x0 = xk
                    if input_var:
                        x0 = xk + gamma * rng.noise(
                            self.seed, call, rng.INPUT_PARAM_ID, k, xk.shape
                        )
                    samples[k], left[k] = (params, x0), per_item
                return samples[k]

        readys: list[float] = []
        ends: list[float] = []
        ready_add, end_add = readys.append, ends.append
        self._readys, self._ends, self._events = readys, ends, None
        clock.reset()
        MPI.Prequest.Startall(self._recvs)
        t_first = t_end = tick()
        ps, xs = base, xk
        for kind, i, key, rreq, x, out, sreq, fun, u, tgt, xin, rest in self._plan:
            # ready: when the input was there (an action without a message: at once, and
            # ``events`` reads the end of the action before)
            if rreq is not None:
                if direct:
                    rreq.Wait()
                else:
                    receive(rreq, kind, i, rest)
                ready_add(tick())
            if per_sample:
                ps, xs = sample(rest.sample)
            if kind == FORWARD:  # forward of item i
                if xin:
                    x = xs[rest.row0 : rest.row1]
                caches[key] = fun(x, ps[u], out)
                if len(caches) > peak:
                    peak = len(caches)
                if tgt is not None:
                    item_losses[i], seeds[i] = head(out, tgt, inv_m)
            elif kind == WEIGHT:  # the weight gradient from I's stash; frees the item's stash
                fun(stashes.pop(key), caches.pop(key), ps[u], gviews[u])
            else:  # backward (B) or input gradient (I) of item i
                if tgt is not None:
                    x, seeds[i] = seeds[i], None
                if kind == INPUT:
                    stashes[key] = fun(x, caches[key], ps[u], gviews[u], out)
                else:
                    fun(x, caches.pop(key), ps[u], gviews[u], out)
                if xin:
                    gdelta[rest.row0 : rest.row1] += out
            if timed:
                if rest.emulated > 0:
                    self._emulate(kind, u)
                if model:
                    clock.advance(rest.cost)
            if per_sample and kind != FORWARD and kind != INPUT:
                k = rest.sample
                left[k] -= 1
                if left[k] == 0:
                    del samples[k], left[k]
            if sreq is not None:
                if model:  # the message carries its send time
                    rest.send_slot[-1] = tick()
                sreq.Start()
            t_end = tick()
            end_add(t_end)
        self.peak_stash = peak
        return self._finish(grad, t_first, t_end, reduce, call)

    def _finish(
        self, grad: np.ndarray, t_first: float, t_end: float, reduce: str, call: int
    ) -> OracleResult:
        """End of a call: this rank's sends complete, the mean over samples, then every
        rank gets the last stage's item losses and the call's time: max over ranks of
        t_end − t_first of the rank that holds stage 0.

        The pipeline starts there: every other rank's first action waits for a message
        that stage 0's first forward starts, so a rank that enters the call earlier (it
        had less to do between calls than rank 0, which updates θ) only waits, and the
        model's makespan (``simulator``) starts at stage 0's first action too. On the
        model clock every rank's t_first is 0, so the figure is unchanged there."""
        self._t_first = t_first
        origin = self.clock.origin
        if origin != 0.0:  # the wall clock ticks raw perf_counter seconds
            t_first -= origin
            t_end -= origin
        req = self._gather_req
        if req is not None:  # under way while the sends complete and the gradient is copied
            mine = self._gather[2]
            mine[0], mine[1] = -t_first, t_end
            req.Start()
        if self.waiter.timeout > 0:
            self.waiter.waitall(
                self._sends, f"rank {self.rank} waits for its sends of call {call} to complete"
            )
        else:
            self.waiter.waitall(self._sends)
        if reduce == "mean" and self.samples > 1:
            grad /= self.samples
        comm = self.comm
        if self.size > 1 and self._gather is not None:
            # one collective: every rank's (−t_first, t_end, losses); the last rank's
            # losses and the max of each time column are the two collectives' results
            send, recv, mine, every, losses, ends = self._gather
            if req is not None:
                grad = grad.copy()
                req.Wait()
            else:
                mine[0], mine[1] = -t_first, t_end
                comm.Allgather(send, recv)
                grad = grad.copy()
            item_losses = losses.copy()
            elapsed = max(ends.tolist()) + every.item(self.first_rank, 0)  # exact
        elif self.size > 1:
            item_losses = self.item_losses
            comm.Bcast([item_losses, MPI.DOUBLE], root=self.last_rank)
            self._tbuf[0] = -t_first if self.rank == self.first_rank else -math.inf
            self._tbuf[1] = t_end
            comm.Allreduce(MPI.IN_PLACE, [self._tbuf, MPI.DOUBLE], op=MPI.MAX)
            elapsed = self._tbuf[1] + self._tbuf[0]
            item_losses, grad = item_losses.copy(), grad.copy()
        else:
            item_losses, grad = self.item_losses.copy(), grad.copy()
            elapsed = t_end - t_first
        return OracleResult(None, item_losses, grad, float(elapsed), self.samples)


def _persistent_allgather(comm, send: list, recv: list):
    """``MPI_Allgather_init`` (MPI 4) on the buffers, or None where the library lacks it
    (the call then uses the blocking ``Allgather``)."""
    try:
        return comm.Allgather_init(send, recv)
    except (NotImplementedError, AttributeError, MPI.Exception):
        return None


def _first_of(views: list) -> list:
    """A one-layer stage's parameters: its layer's list."""
    return views[0]


def _same(views: list) -> list:
    return views
