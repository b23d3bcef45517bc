"""Drive an optimizer over an executor: one run, its per-iteration rows, its status.

All ranks execute the same loop in lockstep; every decision (stop, diverge)
is taken on values that are identical on all ranks (the losses the executor
broadcasts and one Allreduce per iteration), so no rank is left waiting.
The parts: ``make_problem`` / ``make_method`` (from the registries),
``Run.__init__`` (setup), ``Run.iteration``, the stop rules ``diverged`` and
``Run.over_budget``, resume (``hpcpipe.run.checkpoint``), and the output
(``Run.open_output``, ``Run.flush``, ``Run.finish``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import socket
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from hpcpipe.errors import InjectedFailure
from hpcpipe.machine.cores import cores
from hpcpipe.machine.foreign import ForeignLoad
from hpcpipe.model.stages import clear_block_cache, stage_offsets
from hpcpipe.optim import OPTIMIZERS, Optimizer, OptState
from hpcpipe.optim.methods import theory_plan
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import OracleResult
from hpcpipe.pipeline.executors import EXECUTORS, Executor
from hpcpipe.pipeline.recording import Recorder, recorder_for
from hpcpipe.problems import PROBLEMS, Problem
from hpcpipe.run import checkpoint
from hpcpipe.run.config import DISK_FAULTS, ConfigError, RunConfig, check_output, validate
from hpcpipe.run.outcome import outcome
from hpcpipe.run.progress import Progress, StopFlag


class Row(NamedTuple):
    """One iteration's record (a row of the result's /iterations table)."""

    iteration: int
    loss: float  # mean oracle loss at the evaluation point y_t
    f: float  # exact f(θ_t) (NaN between evaluations)
    best_f: float
    gap: float  # f − f* where f* is known
    grad_norm: float
    step: float
    pipeline_time: float  # cumulative, on the executor's clock
    wall_time: float


COLUMNS = Row._fields
OUTCOME_COLUMNS = ("iteration", "gap", "pipeline_time")  # what outcome() reads


@dataclass
class RunResult:
    config: RunConfig
    method: Optimizer
    status: str  # complete | diverged | incomplete (stopped by a signal)
    table: np.ndarray  # rows of COLUMNS
    theta: np.ndarray  # this rank's part of the final iterate
    info: dict = field(default_factory=dict)

    def column(self, name: str) -> np.ndarray:
        return self.table[:, COLUMNS.index(name)]

    @property
    def last(self) -> Row | None:
        """The last row, with its named fields (None for a run without rows)."""
        if not len(self.table):
            return None
        row = self.table[-1]
        return Row(int(row[0]), *(float(x) for x in row[1:]))


def make_problem(cfg: RunConfig, comm) -> Problem:
    """The registered problem built from the settings; its model must have cfg.depth blocks."""
    prob = PROBLEMS.get(cfg.problem).build(cfg, comm)
    check_depth(cfg, prob)
    return prob


def check_depth(cfg: RunConfig, prob: Problem) -> None:
    """The model clock charges every block of the problem's model: depth must say how many."""
    if prob.depth != cfg.depth:
        raise ConfigError(
            f"depth = {cfg.depth} is not allowed: problem {cfg.problem!r} builds a model of "
            f"{prob.depth} blocks; set depth = {prob.depth}"
        )


def cost_model(cfg: RunConfig, prob: Problem, n_ranks: int, gamma: float = 0.0) -> CostModel:
    """The model clock's costs: the τ-unit settings, or the machine profile's seconds.

    With ``machine``, per-block t_F, t_B from the profile's layer times at the
    model's width and the rows of the largest work item, α, β of the wait
    policy the run uses at its rank (or stage) count (``machine.profile``), and,
    for calls that smooth the input (``gamma`` ≠ 0, variable = input), the
    profile's draw of the noise Z_k on the first block's forward.
    """
    if not cfg.machine:
        return CostModel.uniform(prob.depth, cfg.t_forward, cfg.t_backward, cfg.alpha, cfg.beta)
    from hpcpipe.machine.profile import read
    from hpcpipe.model.stages import microbatch_bounds
    from hpcpipe.run.config import machine_policy, machine_ranks

    ranks = machine_ranks(cfg, n_ranks) or n_ranks
    rows = max(r1 - r0 for r0, r1 in microbatch_bounds(prob.batch.m, cfg.n_micro))
    profile = read(cfg.machine)
    policy = machine_policy(cfg, ranks)
    noise = gamma != 0.0 and prob.variable == "input"
    return profile.cost_model(
        prob.spec, rows, policy, cfg.layer_time, stages=ranks, input_noise=noise
    )


def make_method(cfg: RunConfig, prob: Problem) -> tuple[Optimizer, int]:
    """The optimizer and the number of iterations T (planned from ε in theory mode)."""
    if cfg.mode == "theory":
        plan = theory_plan(cfg.optimizer, cfg.epsilon, prob.L, prob.R, prob.dim, prob.beta)
        return plan.method, plan.iterations
    return OPTIMIZERS.get(cfg.optimizer).from_config(cfg), cfg.iterations


def diverged(loss: float, gnorm: float, first: float, factor: float) -> bool:
    """Stop rule: a non-finite loss or gradient, or a loss grown by factor·max(|f₀|, 1)."""
    return (
        not math.isfinite(loss)
        or not math.isfinite(gnorm)
        or loss - first > factor * max(abs(first), 1.0)
    )


class Run:
    """One run on one rank: its problem, optimizer, executors, state and output.

    Resources (executors, the writer, the signal handlers) are entered on
    ``stack`` and freed when it closes, on every path.
    """

    def __init__(
        self,
        cfg: RunConfig,
        comm,
        prob: Problem,
        opt: Optimizer,
        T: int,
        stack: ExitStack,
        label: str | None = None,
        on_iteration=None,
    ):
        self.cfg, self.comm, self.prob, self.opt, self.T = cfg, comm, prob, opt, T
        self.on_iteration = on_iteration
        self.stack = stack
        costs = self.costs = cost_model(cfg, prob, comm.size, opt.gamma)
        make = EXECUTORS.get(cfg.executor)
        common = {k: getattr(cfg, k) for k in ("schedule", "seed", "clock", "wait", "timeout")}
        common.update(variable=prob.variable, weights=prob.weights, costs=costs, stages=cfg.stages)
        self.eng: Executor = stack.enter_context(
            make(
                comm,
                prob.spec,
                prob.batch,
                samples=opt.samples,
                microbatches=cfg.n_micro,
                layer_time=cfg.layer_time,
                **common,
            )
        )
        self.ev: Executor | None = None
        if cfg.eval_every:
            plain = {**common, "costs": cost_model(cfg, prob, comm.size)}  # γ = 0 calls
            self.ev = stack.enter_context(
                make(comm, prob.spec, prob.batch, samples=1, microbatches=prob.batch.m, **plain)
            )
        clear_block_cache()  # both executors hold their layers now
        # f(θ) evaluated by the oracle's own executor, its answer kept for the next call
        # (``exact_f``): only where that is the same computation (γ = 0, K = 1, the
        # evaluator's row split) and a call's time does not depend on running it
        self.reuse_f = bool(
            self.ev is not None
            and getattr(self.eng, "timed_by_model", False)
            and opt.gamma == 0.0
            and opt.samples == 1
            and cfg.n_micro == prob.batch.m
        )
        self.kept: tuple[np.ndarray, OracleResult] | None = None
        self.project = prob.project if comm.rank == 0 else (lambda v: v)
        self.state: OptState = opt.init(self.eng.initial_point(), self.project)
        self.offsets = _offsets(prob, comm)
        self.recorder: Recorder = recorder_for(
            self.eng, cfg.timeline_limit, cfg.timeline_every, bool(cfg.output)
        )
        self.tally = checkpoint.Tally()
        self.rows: list[Row] = []
        self.flushed = 0
        self.writer = None
        self.hosts: list[str] | None = None  # each rank's host (rank 0, with an output)
        self.extra: dict = {}
        self.red = np.zeros(3)
        self.f_star = prob.f_star if prob.f_star is not None else math.nan
        self.inject = _injection(cfg.inject_failure)
        self.stop = stack.enter_context(StopFlag())
        self.progress = Progress(cfg.progress, T, label or cfg.optimizer, comm.rank == 0)
        self.wall0 = time.perf_counter()
        # the machine's load, for wall-clock verdicts (``studies.common.load_check``): the
        # load average, and the CPU other processes used during the run (machine.foreign)
        self.extra["load_start"], self.extra["cores"] = _load(), cores()
        self.foreign = ForeignLoad(comm)

    # ------------------------------------------------------------ resume and output
    def restore(self, path: str) -> None:
        self.state = checkpoint.restore(
            path, self.comm, self.state, self.tally, self.recorder, self.offsets
        )

    def open_output(self, resume: str | None, overrides: dict | None = None) -> None:
        """Open the result file (rank 0; gathers host names on every rank); a failure to
        open it is raised on every rank. ``overrides``: settings changed on a resume."""
        if not self.cfg.output:
            return
        # the placement: host of each rank (rank 0), for the file and the prediction
        self.hosts = self.comm.gather(socket.gethostname(), root=0)
        if resume is not None:
            layout = checkpoint.layout(self.state)
            last = self.tally.next - 1
            self.writer = _collective(
                self.comm, lambda: _reopen_writer(resume, self.comm, last, overrides, layout)
            )
        else:
            self.writer = _collective(
                self.comm,
                lambda: _open_writer(self.cfg, self.comm, self.prob, self.opt, self.T, self),
            )
        if self.writer is not None:
            self.stack.enter_context(self.writer)
            if self.inject is not None and self.inject[2] in DISK_FAULTS:
                code = errno.ENOSPC if self.inject[2] == "enospc" else errno.EDQUOT
                self.writer.fail_at = (code, self.inject[1])

    def flush(self) -> None:
        """Append new rows and gathered events and flush them, then save the state (collective).

        The rows go first: a kill at any moment leaves rows that reach at least the saved
        state's iteration (rows beyond it are dropped on resume), never a state ahead of
        the rows it follows.
        """
        from hpcpipe.run import results

        ev = self.recorder.gather(self.comm)
        state = checkpoint.gather(self.comm, self.state, self.tally, self.recorder, self.offsets)
        err = None
        if self.writer is not None:
            new = self.rows[self.flushed :]
            try:  # a full disk shows in reserve(), before HDF5 writes anything of this flush
                last = new[-1].iteration if new else self.tally.next - 1
                self.writer.reserve(self.writer.room(len(new), len(ev)), last)
                if new:
                    self.writer.append_iterations(np.array(new, dtype=float))
                self.writer.append_timeline(ev)
                results.save_point("rows-written")
                self.writer.flush()
                results.save_point("rows-flushed")
                self.writer.reserve(self.writer.room(0, 0), last)
                self.writer.save_state(*state)
            except (OSError, RuntimeError) as e:
                full = results.disk_full(self.writer.path, e)
                if full is None:
                    raise
                self.writer.abandon()
                err = str(full)
        self.bcast_error(err)
        self.flushed = len(self.rows)

    def bcast_error(self, err: str | None) -> None:
        """Rank 0's write error (a full disk) raised on every rank alike: all stop (collective)."""
        from hpcpipe.run.results import DiskFullError

        err = self.comm.bcast(err, root=0)
        if err:
            raise DiskFullError(err)

    # ------------------------------------------------------------ evaluation
    def penalised(self, value: float, point: np.ndarray) -> float:
        """value + r(θ) summed over ranks (one Allreduce; r = 0 without a regulariser)."""
        reg = self.prob.regulariser
        self.red[0] = reg.value(point) if reg is not None else 0.0
        self.comm.Allreduce(MPI.IN_PLACE, [self.red[:1], MPI.DOUBLE], op=MPI.SUM)
        return value + self.red[0]

    def exact_f(self, theta: np.ndarray, call: int = 0) -> tuple[float, np.ndarray]:
        """f(θ) without smoothing, and the per-item losses (for the problem's metrics).

        With ``reuse_f``, when the next oracle call may be at θ (``next_point_is_theta``),
        it is the oracle's call ``call`` at θ with γ = 0, kept with θ: when the next oracle
        call is at that same array (GD: y_{t+1} = θ_{t+1}; the optimizers return new
        arrays and never write into θ) it is that answer, bitwise, where it would
        otherwise be computed twice (``oracle``).
        Otherwise, on an executor timed by the model, the losses alone (no backward)."""
        if self.reuse_f and self.opt.next_point_is_theta(self.state):
            res = self.eng.evaluate(theta, 0.0, call=call)
            self.kept = (theta, res)
        elif getattr(self.ev, "timed_by_model", False):  # no backward pass: f only
            res = self.ev.evaluate(theta, gradient=False)
        else:
            res = self.ev.evaluate(theta)
        return self.penalised(res.loss, theta), res.item_losses

    def oracle(self, y: np.ndarray, it: int) -> OracleResult:
        """The oracle's answer at y for call ``it``: the kept f(θ) call when it was at y
        (``exact_f``), else the executor's."""
        kept, self.kept = self.kept, None
        if kept is not None and kept[0] is y:
            return kept[1]
        return self.eng.evaluate(y, self.opt.gamma, call=it)

    def initial_gap(self) -> None:
        """f(θ₀) (the level a run "ends worse than it started" is judged against) and
        f(θ₀) − f*: a study whose ε is above it measures nothing (θ₀ already reaches ε)."""
        if self.ev is not None:
            theta0 = self.eng.initial_point()
            if self.tally.next == 1 and np.array_equal(self.state["theta"], theta0):
                theta0 = self.state["theta"]  # the first point: its answer may serve call 1
            f0 = self.exact_f(theta0, self.tally.next)[0]
            self.extra["f_initial"] = float(f0)
            if self.prob.f_star is not None:
                self.extra["initial_gap"] = float(f0 - self.prob.f_star)

    # ------------------------------------------------------------ the loop
    def iteration(self, it: int) -> str:
        """One oracle call and update; appends its row, returns the status after it."""
        cfg, prob, opt, tally, red = self.cfg, self.prob, self.opt, self.tally, self.red
        self._maybe_fail(it)
        y = opt.point(self.state, self.project)
        res = self.oracle(y, it)
        reg = prob.regulariser
        grad = res.grad + reg.grad(y) if reg is not None else res.grad
        self.recorder.record(it, res.time)
        red[0] = reg.value(y) if reg is not None else 0.0
        red[1] = float(grad @ grad)
        red[2] = 1.0 if self.stop.raised else 0.0
        self.comm.Allreduce(MPI.IN_PLACE, [red, MPI.DOUBLE], op=MPI.SUM)
        loss, gnorm = res.loss + red[0], math.sqrt(red[1])
        tally.mtime += res.time
        if math.isnan(tally.first):
            tally.first = loss
        if diverged(loss, gnorm, tally.first, cfg.diverge_factor):
            wall = time.perf_counter() - self.wall0
            nan = math.nan
            self.rows.append(Row(it, loss, nan, tally.best, nan, gnorm, opt.lr, tally.mtime, wall))
            return "diverged"
        self.state = opt.update(self.state, y, grad, self.project)
        tally.next = it + 1
        status, f = "complete", math.nan
        if self.ev is not None and (it % cfg.eval_every == 0 or it == self.T):
            f, items = self.exact_f(self.state["theta"], it + 1)
            if not math.isfinite(f):
                status = "diverged"
            tally.best = min(tally.best, f)
            self.extra.update(prob.metrics(items))
        wall = time.perf_counter() - self.wall0
        row = Row(it, loss, f, tally.best, f - self.f_star, gnorm, opt.lr, tally.mtime, wall)
        self.rows.append(row)
        if red[2] > 0:
            status = "incomplete"
        self.report(it, status)
        return status

    def report(self, it: int, status: str) -> None:
        """A finished iteration: the caller's hook, the progress line, the periodic flush."""
        if self.on_iteration is not None:
            self.on_iteration(self.rows[-1])
        self.progress.update(it, self.rows[-1].loss, self.tally.mtime)
        if self.cfg.output and (it % self.cfg.flush_every == 0 or status != "complete"):
            self.flush()

    def over_budget(self) -> bool:
        """Stop rule: the pipeline time has reached ``time_budget`` (0: no budget)."""
        return bool(self.cfg.time_budget) and self.tally.mtime >= self.cfg.time_budget

    def reached(self) -> bool:
        """Stop rule ``stop_at_epsilon``: the last evaluation has f − f* <= ε (its gap is
        the same on every rank: f comes from the executor's broadcast losses)."""
        if not self.cfg.stop_at_epsilon or not self.rows:
            return False
        gap = self.rows[-1].gap
        return math.isfinite(gap) and gap <= self.cfg.epsilon

    def step(self, it: int) -> str | None:
        """Iteration ``it``; the run's final status when a stop rule, a signal or T ends
        the run there, else None."""
        status = self.iteration(it)
        if status != "complete" or self.over_budget():
            return status
        if self.reached():
            self.extra["stopped_at_epsilon"] = it
            return status
        return status if it >= self.T else None

    def loop(self) -> str:
        """Iterations from the next one to T, until a stop rule or a signal; the status."""
        for it in range(self.tally.next, self.T + 1):
            status = self.step(it)
            if status is not None:
                return status
        return "complete"

    def finish(self, status: str) -> RunResult:
        """Final figures and status into the file; the RunResult of this rank."""
        cfg, comm, tally = self.cfg, self.comm, self.tally
        last_loss = self.rows[-1].loss if self.rows else math.nan
        self.progress.update(len(self.rows), last_loss, tally.mtime, force=True)
        self.extra.update(self.prob.info)
        self.extra["iterations_planned"] = self.T
        self.extra["load_end"] = _load()
        foreign = self.foreign.stop()
        if math.isfinite(foreign):
            self.extra["foreign_cpu"] = round(foreign, 3)
        if type(self.prob).final_metrics is not Problem.final_metrics:  # gather only if used
            parts = (self.eng.initial_point(), self.state["theta"])
            whole = [np.concatenate(comm.allgather(part)) for part in parts]
            self.extra.update(self.prob.final_metrics(*whole))
        cols = [np.array([getattr(r, c) for r in self.rows]) for c in OUTCOME_COLUMNS]
        self.extra.update(outcome(cfg, self.prob, *cols))
        if cfg.output:
            self.flush()
            summary = self.recorder.stage_summary(comm)
            if self.writer is not None:
                self.writer.set_stages(
                    summary[:, 0], summary[:, 1], summary[:, 2], summary[:, 3].astype(np.int64)
                )
                # oracle calls, resumed ones too
                done = self.rows[-1].iteration if self.rows else tally.next - 1
                figures = derived_figures(
                    cfg,
                    self.eng,
                    summary,
                    tally.mtime,
                    done,
                    self.prob.depth,
                    self.hosts,
                    self.costs,
                )
                info = {"info": json.dumps(self.extra), "figures": json.dumps(figures)}
                self.extra["figures"] = figures
            self.bcast_error(self._close(status, info) if self.writer is not None else None)
            # no rank leaves before the file is closed: mpiexec ends the whole job when one
            # rank exits with a non-zero status (143 after SIGTERM) while rank 0 still writes
            comm.Barrier()
        table = np.array(self.rows, dtype=float).reshape(-1, len(COLUMNS))
        return RunResult(cfg, self.opt, status, table, self.state["theta"], self.extra)

    def _close(self, status: str, info: dict) -> str | None:
        """Close the file with its final status (rank 0); a full disk's message, or None."""
        from hpcpipe.run import results

        try:
            self.writer.reserve(64 * 1024, self.T + 1)
            self.writer.close(status, info)
        except (OSError, RuntimeError) as e:
            full = results.disk_full(self.writer.path, e)
            if full is None:
                raise
            self.writer.abandon()
            return str(full)
        return None

    def _maybe_fail(self, it: int) -> None:
        """The ``inject_failure`` test hook: raise, or hang, on one rank at one iteration."""
        if self.inject is not None and self.inject[2] in DISK_FAULTS:
            return  # the writer's (Run.open_output)
        if self.inject is not None and self.inject[:2] == (self.comm.rank, it):
            if self.inject[2] == "hang":  # stop making progress: the others' watchdog must fire
                time.sleep(3600)
            raise InjectedFailure(
                f"injected failure on rank {self.comm.rank} at iteration {it} "
                "(config inject_failure)"
            )


def run(
    cfg: RunConfig,
    comm=None,
    label: str | None = None,
    problem: Problem | None = None,
    on_iteration=None,
    resume: str | None = None,
    resume_overrides: dict | None = None,
) -> RunResult:
    """Run one optimisation; returns the same RunResult on every rank (its own θ part).

    With ``resume`` (a result file left ``incomplete``), the run continues
    from the file's last flushed iteration, appending to the same file; for
    the same number of ranks it reaches the same iterates bitwise, since the
    noise is keyed by iteration and the optimizer state is restored exactly.
    ``on_iteration(row)`` is called with each finished iteration's Row.
    ``resume_overrides`` (settings that do not change the numbers, e.g. progress)
    are recorded in the file's ``resume_overrides`` attribute.

    The SIGTERM / SIGINT handler stays installed until the file is closed (it
    is restored when the run's resources are freed): the launcher and mpiexec
    forward a signal more than once, and a late copy must not kill a rank while
    it writes the final summary; and every rank waits for that close, since
    mpiexec kills the job when a rank exits 143 before it.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    cfg, comm, prob, opt, T = _prepare(cfg, comm, problem, resume)
    with ExitStack() as stack:
        r = Run(cfg, comm, prob, opt, T, stack, label, on_iteration)
        if resume is not None:
            r.restore(resume)
        r.open_output(resume, resume_overrides)
        r.initial_gap()
        return r.finish(r.loop())


def _prepare(cfg: RunConfig, comm, problem: Problem | None, resume: str | None):
    """Validate a run's settings, build its problem and method; (cfg, comm, prob, opt, T)
    with the watchdog's communicator."""
    validate(cfg, comm.size, check_output=False)
    if resume is None:
        err = comm.bcast(_output_error(cfg) if comm.rank == 0 else None, root=0)
        if err:
            raise ConfigError(err)
    prob = problem if problem is not None else make_problem(cfg, comm)
    check_depth(cfg, prob)
    if cfg.stop_at_epsilon and prob.f_star is None:
        raise ConfigError(
            f"stop_at_epsilon = 1 is not allowed: problem {cfg.problem!r} does not know f*; "
            "set stop_at_epsilon = 0"
        )
    opt, T = make_method(cfg, prob)
    cfg, comm = _watchdog(cfg, comm)
    return cfg, comm, prob, opt, T


def run_together(
    cfgs: list[RunConfig], comm=None, labels: list[str] | None = None, between=None
) -> list[RunResult]:
    """Several runs side by side, iteration by iteration (each as ``run`` would do it):
    iteration t of every run, then ``between()``, then iteration t + 1.

    For runs whose oracle answers are shared through an executor's kept answers (the
    reduced route at several depths, ``pipeline.reduced``), the first run computes call
    t and the others are served while it is kept, so ``between`` can forget it (the
    memory is that of one iteration, whatever T). Each run stops by its own rules and
    writes its own file; a signal stops them all at the end of an iteration."""
    comm = comm if comm is not None else MPI.COMM_WORLD
    labels = labels or [None] * len(cfgs)
    with ExitStack() as stack:
        runs = []
        for cfg, label in zip(cfgs, labels):
            cfg, sub, prob, opt, T = _prepare(cfg, comm, None, None)
            runs.append(Run(cfg, sub, prob, opt, T, stack, label))
        for r in runs:  # one flag: the last handler installed is the one a signal reaches
            r.stop = runs[-1].stop
            r.open_output(None)
            r.initial_gap()
        status: dict[int, str] = {}
        for it in range(1, max(r.T for r in runs) + 1):
            for i, r in enumerate(runs):
                if i not in status:
                    final = r.step(it)
                    if final is not None:
                        status[i] = final
            if between is not None:
                between()
            if len(status) == len(runs):
                break
        return [r.finish(status.get(i, "complete")) for i, r in enumerate(runs)]


def _watchdog(cfg: RunConfig, comm) -> tuple[RunConfig, object]:
    """The run's timeout resolved (``watchdog.effective_timeout``; recorded as used) and
    ``comm`` with every wait bounded by it (collective; ``comm`` itself when off).

    The predicted iteration time of the automatic timeout is the emulated work done one
    action at a time: 2 x depth x K x M x layer_time (0 without emulated layers)."""
    from hpcpipe.pipeline.watchdog import effective_timeout, watched

    predicted = 2 * cfg.depth * cfg.samples * cfg.n_micro * cfg.layer_time
    timeout = effective_timeout(cfg.timeout, predicted)
    if cfg.executor != "mpi":
        timeout = 0.0  # one process: no peer to lose
    if timeout != cfg.timeout:
        cfg = dataclasses.replace(cfg, timeout=timeout)
    return cfg, watched(comm, timeout)


def derived_figures(
    cfg: RunConfig,
    eng: Executor,
    summary: np.ndarray,
    pipeline_time: float,
    iterations: int,
    depth: int,
    hosts: list[str] | None = None,
    costs: CostModel | None = None,
) -> dict:
    """Per-run figures: bubble fraction and, with emulated layers or a machine profile,
    efficiency.

    bubble fraction = 1 − Σ_r busy_r / (R · total pipeline time) over the R ranks
    (= stages with one stage per rank); with
    ``layer_time`` > 0 the model's prediction is the simulator's makespan of
    the schedule with t_F = t_B = layer_time per layer per iteration, messages
    costing α_intra + n·β_intra on hops inside a node and α_inter + n·β_inter on
    hops between nodes (``placement``; ``hosts``: the host of each rank; all 0
    by default: no message cost); with a machine profile (``machine``) it is
    the makespan under the profile's costs (``costs``: layer times, emulated
    action, α + bytes·β per message, in seconds). Efficiency = prediction /
    measured wall-clock pipeline time.
    """
    from hpcpipe.pipeline.simulator import message_costs, simulate, stage_times

    S, R = eng.schedule.n_stages, eng.schedule.n_ranks
    busy = float(summary[:, 0].sum())
    out = {
        "iterations": iterations,
        "pipeline_time": pipeline_time,
        "bubble_fraction": 1.0 - busy / (R * pipeline_time) if pipeline_time > 0 else 0.0,
    }
    if cfg.machine and costs is not None and iterations > 0:
        tf, tb = stage_times(costs, depth, S)
        msg = None
        if S > 1:
            widths, rows = _boundaries(eng, depth, S)
            msg = message_costs(costs, widths, rows)
        per = simulate(eng.schedule, tf, tb, msg).makespan
        out["predicted_pipeline_time"] = per * iterations
        if cfg.clock == "wall":
            out["efficiency"] = per * iterations / pipeline_time
    elif cfg.layer_time > 0 and iterations > 0:
        tf, tb = stage_times(CostModel.uniform(depth, cfg.layer_time), depth, S)
        per = simulate(eng.schedule, tf, tb, _hop_costs(cfg, eng, hosts)).makespan
        out["predicted_pipeline_time"] = per * iterations
        if cfg.clock == "wall":
            out["efficiency"] = per * iterations / pipeline_time
    return out


def _hop_costs(cfg: RunConfig, eng: Executor, hosts: list[str] | None):
    """Per-(boundary, item) message costs of the wall-clock prediction (``placement``).

    None (no message cost) when every α, β is 0. The MPI engine runs stage s on
    rank placement[s] (a hop inside a rank is a local copy: its cost is dropped
    by the simulator); the simulated executor runs every stage in one process.
    """
    from hpcpipe.model.stages import partition
    from hpcpipe.pipeline.placement import LinkCosts, crossings, hop_costs

    links = LinkCosts(cfg.alpha_intra, cfg.beta_intra, cfg.alpha_inter, cfg.beta_inter)
    spec = getattr(eng, "spec", None)
    if links.zero or spec is None:
        return None
    S = eng.schedule.n_stages
    dims = spec.dims()
    widths = [dims[hi] for _, hi in partition(spec.depth, S)[:-1]]
    rows = [b - a for a, b in eng.rows]
    item_rows = [rows[i % len(rows)] for i in range(eng.schedule.n_items)]
    placement = eng.schedule.placement
    placed = (
        [hosts[r] for r in placement] if hosts is not None and cfg.executor == "mpi" else [""] * S
    )
    return hop_costs(links, crossings(placed, S), widths, item_rows)


def _boundaries(eng: Executor, depth: int, S: int) -> tuple[list[int], list[int]]:
    """Feature widths between consecutive stages and the rows of each work item."""
    from hpcpipe.model.stages import partition

    dims = eng.spec.dims()
    widths = [dims[hi] for _, hi in partition(depth, S)[:-1]]
    M = eng.microbatches
    rows = [r1 - r0 for r0, r1 in (eng.rows[i % M] for i in range(eng.n_items))]
    return widths, rows


def _load() -> float:
    """The 1-minute load average (NaN where the platform has none)."""
    return float(os.getloadavg()[0]) if hasattr(os, "getloadavg") else math.nan


def _injection(spec: str) -> tuple[int, int, str] | None:
    """``RANK:ITERATION`` (raise), ``RANK:ITERATION:hang`` (stop responding), or
    ``enospc:ITERATION`` / ``edquot:ITERATION`` (rank 0's result file: (0, it, kind))."""
    if not spec:
        return None
    parts = [x.strip() for x in spec.split(":")]
    if parts[0] in DISK_FAULTS:
        return 0, int(parts[1]), parts[0]
    return int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "raise"


def _offsets(prob: Problem, comm) -> list[int]:
    """Where each rank's part of θ sits in the full vector."""
    if prob.variable == "weights":
        return stage_offsets(prob.spec, comm.size)
    return [0] + [prob.dim] * comm.size


def _collective(comm, make):
    """``make()`` on every rank (rank 0 may fail); its error, if any, raised on every rank."""
    from hpcpipe.errors import ResultsError

    out, err = None, None
    try:
        out = make()
    except ResultsError as e:
        err = str(e)
    err = comm.bcast(err, root=0)
    if err:
        raise ResultsError(err)
    return out


def _reopen_writer(path: str, comm, last_iteration: int, overrides: dict | None, layout):
    from hpcpipe.run.results import Writer

    if comm.rank != 0:
        return None
    return Writer.reopen(
        path,
        last_iteration,
        COLUMNS,
        log=lambda m: print(f"hpcpipe: {m}", file=sys.stderr, flush=True),
        overrides=overrides,
        state_layout=layout,
    )


def _open_writer(cfg: RunConfig, comm, prob: Problem, opt: Optimizer, T: int, run: Run):
    from hpcpipe.run.results import Writer
    from hpcpipe.studies.calibrated import model_fields

    if comm.rank != 0:
        return None
    hosts = run.hosts
    entry = PROBLEMS.get(cfg.problem)
    attrs = {
        "config": cfg.to_json(),
        "method": json.dumps(
            {
                **opt.describe(),
                "entry": cfg.optimizer,
                "module": type(opt).__module__,
                "iterations": T,
            }
        ),
        "problem": json.dumps(
            {
                **prob.constants(),
                "entry": cfg.problem,
                "module": entry.build.__module__,
                "variable": prob.variable,
                **model_fields(prob.spec),
            }
        ),
        "n_ranks": comm.size,
        "hosts": sorted(set(hosts)),
        "rank_hosts": json.dumps(hosts),  # placement: the host of rank r at index r
        "clock": cfg.clock,
        "executor": cfg.executor,
        "n_stages": run.eng.schedule.n_stages,
    }
    if cfg.machine:  # the profile itself, so the file says what its seconds were made of
        from hpcpipe.machine.profile import read

        attrs["machine_profile"] = read(cfg.machine).text
        attrs["model_time_unit"] = "s"
    for k, v in json.loads(cfg.to_json()).items():
        attrs[f"config.{k}"] = v
    layout = checkpoint.layout(run.state)
    return Writer(
        cfg.output,
        attrs,
        COLUMNS,
        run.eng.schedule.n_ranks,
        state_size=run.offsets[-1],
        state_layout=layout,
    )


def _output_error(cfg: RunConfig) -> str | None:
    try:
        check_output(cfg)
    except ConfigError as e:
        return str(e)
    return None


def gather_theta(result: RunResult, comm, problem: Problem) -> np.ndarray:
    """The whole final iterate on every rank (for tests and reports; not a hot path)."""
    parts = comm.allgather(result.theta)
    full = np.concatenate(parts)
    if problem.variable == "weights":
        assert full.size == stage_offsets(problem.spec, comm.size)[-1]
    return full
