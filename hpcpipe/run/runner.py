"""Drive an optimizer over the engine: one run, its per-iteration table, its status.

All ranks execute the same loop in lockstep; every decision (stop, diverge)
is taken on values that are identical on all ranks (the losses the engine
broadcasts and one Allreduce per iteration), so no rank is left waiting.
"""

from __future__ import annotations

import json
import math
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpcpipe.model.stages import clear_block_cache, stage_offsets
from hpcpipe.optim.methods import Method, State, theory_plan
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.executors import EXECUTORS
from hpcpipe.pipeline.recording import Recorder, SimulatedRecorder
from hpcpipe.problems.builtin import Problem, attack, fewshot, l1_chain, max_chain, quad_chain
from hpcpipe.run.config import ConfigError, RunConfig, check_output, validate

COLUMNS = (
    "iteration",
    "loss",
    "f",
    "best_f",
    "gap",
    "grad_norm",
    "step",
    "pipeline_time",
    "wall_time",
)


@dataclass
class RunResult:
    config: RunConfig
    method: Method
    status: str  # complete | diverged | incomplete (stopped by a signal)
    table: np.ndarray  # rows of COLUMNS
    theta: np.ndarray  # this rank's part of the final iterate
    info: dict = field(default_factory=dict)

    def column(self, name: str) -> np.ndarray:
        return self.table[:, COLUMNS.index(name)]


def make_problem(cfg: RunConfig, comm) -> Problem:
    if cfg.problem == "l1-chain":
        return l1_chain(cfg.depth, cfg.dim, cfg.seed)
    if cfg.problem == "max-chain":
        return max_chain(cfg.depth, cfg.dim, cfg.seed)
    if cfg.problem == "quad-chain":
        return quad_chain(cfg.depth, cfg.dim, cfg.seed)
    if cfg.problem == "attack":
        return attack(comm, cfg.depth, cfg.width, cfg.m, cfg.seed, cfg.radius)
    return fewshot(cfg.depth, cfg.width, cfg.m, cfg.seed)


def make_method(cfg: RunConfig, prob: Problem) -> tuple[Method, int]:
    if cfg.mode == "theory":
        plan = theory_plan(cfg.optimizer, cfg.epsilon, prob.L, prob.R, prob.dim, prob.beta)
        return plan.method, plan.iterations
    mom = cfg.momentum if cfg.momentum == "nesterov" else float(cfg.momentum)
    if cfg.optimizer == "gd":
        return Method("gd", cfg.lr), cfg.iterations
    return Method(cfg.optimizer, cfg.lr, mom, cfg.gamma, cfg.samples), cfg.iterations


class Progress:
    """Rank-0 progress: a bar on a terminal, periodic plain lines in a batch log."""

    def __init__(self, mode: str, total: int, label: str, enabled: bool):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if enabled else "off"
        self.total, self.label = total, label
        self.t0 = self.last = time.perf_counter()

    def update(self, it: int, loss: float, mtime: float, force: bool = False) -> None:
        if self.mode == "off":
            return
        now = time.perf_counter()
        if self.mode == "bar":
            if force or now - self.last > 0.2:
                frac = it / self.total
                bar = "#" * int(30 * frac)
                sys.stderr.write(
                    f"\r{self.label} [{bar:<30}] {it}/{self.total} "
                    f"loss {loss:.4g} pipeline time {mtime:.4g}"
                )
                sys.stderr.flush()
                self.last = now
            if force:
                sys.stderr.write("\n")
        elif force or now - self.last > 10.0:
            sys.stderr.write(
                f"{self.label}: iteration {it}/{self.total} loss {loss:.6g} "
                f"pipeline time {mtime:.6g} wall {now - self.t0:.1f}s\n"
            )
            sys.stderr.flush()
            self.last = now


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
    ``resume_overrides`` (settings that do not change the numbers, e.g. progress)
    are recorded in the file's ``resume_overrides`` attribute.

    The SIGTERM / SIGINT handler stays installed until the file is closed: the
    launcher and mpiexec forward a signal more than once, and a late copy must
    not kill a rank while it writes the final summary; and every rank waits for
    that close, since mpiexec kills the job when a rank exits 143 before it.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    validate(cfg, comm.size, check_output=False)
    if resume is None:
        err = comm.bcast(_output_error(cfg) if comm.rank == 0 else None, root=0)
        if err:
            raise ConfigError(err)
    prob = problem if problem is not None else make_problem(cfg, comm)
    method, T = make_method(cfg, prob)
    costs = CostModel.uniform(cfg.depth, cfg.t_forward, cfg.t_backward, cfg.alpha, cfg.beta)
    make = EXECUTORS.get(cfg.executor)
    common = dict(
        variable=prob.variable,
        schedule=cfg.schedule,
        seed=cfg.seed,
        clock=cfg.clock,
        costs=costs,
        wait=cfg.wait,
        timeout=cfg.timeout,
        weights=prob.weights,
        stages=cfg.stages,
    )
    eng = make(
        comm,
        prob.spec,
        prob.batch,
        samples=method.samples,
        microbatches=cfg.n_micro,
        layer_time=cfg.layer_time,
        **common,
    )
    ev = (
        make(comm, prob.spec, prob.batch, samples=1, microbatches=prob.batch.m, **common)
        if cfg.eval_every
        else None
    )
    clear_block_cache()  # both engines hold their layers now
    project = prob.project if comm.rank == 0 else (lambda v: v)
    state = State(method, eng.initial_point(), project)
    offsets = _offsets(prob, comm)
    red = np.zeros(3)
    rec = SimulatedRecorder if cfg.executor == "simulated" else Recorder
    recorder = rec(eng, cfg.timeline_limit, cfg.timeline_every, keep=bool(cfg.output))
    loop = {"best": math.inf, "mtime": 0.0, "first": math.nan}
    if resume is not None:
        _restore(resume, comm, state, loop, recorder, offsets)
    writer = None
    if cfg.output:
        writer = _collective(
            comm,
            (lambda: _open_writer(cfg, comm, prob, method, T, offsets[-1], eng.schedule.n_stages))
            if resume is None
            else (lambda: _reopen_writer(resume, comm, state.t - 1, resume_overrides)),
        )
    inject = _injection(cfg.inject_failure)
    flushed, rows, status, extra = 0, [], "complete", {}
    stop = _StopFlag()
    f_star = prob.f_star if prob.f_star is not None else math.nan
    prog = Progress(cfg.progress, T, label or f"{cfg.optimizer}", comm.rank == 0)
    wall0 = time.perf_counter()

    def exact_f(theta):
        res = ev.evaluate(theta)
        red[0] = 0.5 * prob.mu * float(theta @ theta)
        comm.Allreduce(MPI.IN_PLACE, [red[:1], MPI.DOUBLE], op=MPI.SUM)
        return res.loss + red[0], res.item_losses

    def flush():
        nonlocal flushed
        flushed = _flush(writer, comm, recorder, rows, flushed, state, loop, offsets)

    if ev is not None and prob.f_star is not None:
        # f(θ₀) − f*: a study whose ε is above it measures nothing (θ₀ already reaches ε)
        extra["initial_gap"] = float(exact_f(eng.initial_point())[0] - prob.f_star)

    for it in range(state.t, T + 1):
        if inject is not None and inject[:2] == (comm.rank, it):
            if inject[2] == "hang":  # stop making progress: the others' watchdog must fire
                time.sleep(3600)
            raise RuntimeError(
                f"injected failure on rank {comm.rank} at iteration {it} (config inject_failure)"
            )
        y = state.point()
        res = eng.evaluate(y, method.gamma, call=it)
        grad = res.grad + prob.mu * y if prob.mu else res.grad
        recorder.record(it, res.time)
        red[0] = 0.5 * prob.mu * float(y @ y)
        red[1] = float(grad @ grad)
        red[2] = 1.0 if stop.raised else 0.0
        comm.Allreduce(MPI.IN_PLACE, [red, MPI.DOUBLE], op=MPI.SUM)
        loss, gnorm = res.loss + red[0], math.sqrt(red[1])
        loop["mtime"] += res.time
        if math.isnan(loop["first"]):
            loop["first"] = loss
        first = loop["first"]
        wall = time.perf_counter() - wall0
        if (
            not math.isfinite(loss)
            or not math.isfinite(gnorm)
            or loss - first > cfg.diverge_factor * max(abs(first), 1.0)
        ):
            status = "diverged"
            rows.append(
                (it, loss, math.nan, loop["best"], math.nan, gnorm, method.lr, loop["mtime"], wall)
            )
            break
        state.update(y, grad)
        f = math.nan
        if ev is not None and (it % cfg.eval_every == 0 or it == T):
            f, items = exact_f(state.theta)
            if not math.isfinite(f):
                status = "diverged"
            loop["best"] = min(loop["best"], f)
            if prob.name == "attack":
                extra["attack_success"] = float((items < 0).mean())
        rows.append(
            (
                it,
                loss,
                f,
                loop["best"],
                f - f_star,
                gnorm,
                method.lr,
                loop["mtime"],
                time.perf_counter() - wall0,
            )
        )
        if on_iteration is not None:
            on_iteration(rows[-1])
        prog.update(it, loss, loop["mtime"])
        if red[2] > 0:
            status = "incomplete"
        if cfg.output and (it % cfg.flush_every == 0 or status != "complete"):
            flush()
        if status != "complete" or (cfg.time_budget and loop["mtime"] >= cfg.time_budget):
            break
    prog.update(len(rows), rows[-1][1] if rows else math.nan, loop["mtime"], force=True)
    extra.update(prob.info)
    extra["iterations_planned"] = T
    if cfg.output:
        flush()
        summary = recorder.stage_summary(comm)
        if writer is not None:
            writer.set_stages(
                summary[:, 0], summary[:, 1], summary[:, 2], summary[:, 3].astype(np.int64)
            )
            done = int(rows[-1][0]) if rows else state.t - 1  # oracle calls, resumed ones too
            figures = derived_figures(cfg, eng, summary, loop["mtime"], done)
            writer.close(status, {"info": json.dumps(extra), "figures": json.dumps(figures)})
            extra["figures"] = figures
        # no rank leaves before the file is closed: mpiexec ends the whole job when one
        # rank exits with a non-zero status (143 after SIGTERM) while rank 0 still writes
        comm.Barrier()
    eng.close()
    if ev is not None:
        ev.close()
    stop.restore()  # only now: every copy of a forwarded signal was absorbed while writing
    table = np.array(rows, dtype=float).reshape(-1, len(COLUMNS))
    return RunResult(cfg, method, status, table, state.theta, extra)


def derived_figures(
    cfg: RunConfig, eng, summary: np.ndarray, pipeline_time: float, iterations: int
) -> dict:
    """Per-run figures: bubble fraction and, with emulated layers, efficiency.

    bubble fraction = 1 − Σ_s busy_s / (S · total pipeline time); with
    ``layer_time`` > 0 the model's prediction is the simulator's makespan of
    the schedule with t_F = t_B = layer_time per layer (no message cost) per
    iteration, and efficiency = prediction / measured pipeline time.
    """
    from hpcpipe.pipeline.simulator import simulate, stage_times

    S = eng.schedule.n_stages
    busy = float(summary[:, 0].sum())
    out = {
        "iterations": iterations,
        "pipeline_time": pipeline_time,
        "bubble_fraction": 1.0 - busy / (S * pipeline_time) if pipeline_time > 0 else 0.0,
    }
    if cfg.layer_time > 0 and iterations > 0:
        tf, tb = stage_times(CostModel.uniform(cfg.depth, cfg.layer_time), cfg.depth, S)
        per = simulate(eng.schedule, tf, tb).makespan
        out["predicted_pipeline_time"] = per * iterations
        if cfg.clock == "wall":
            out["efficiency"] = per * iterations / pipeline_time
    return out


def _injection(spec: str) -> tuple[int, int, str] | None:
    """``RANK:ITERATION`` (raise) or ``RANK:ITERATION:hang`` (stop responding)."""
    if not spec:
        return None
    parts = spec.split(":")
    return int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "raise"


def _offsets(prob: Problem, comm) -> list[int]:
    """Where each rank's part of θ sits in the full vector."""
    if prob.variable == "weights":
        return stage_offsets(prob.spec, comm.size)
    return [0] + [prob.dim] * comm.size


def _gather_vector(local: np.ndarray, comm, offsets: list[int]) -> np.ndarray | None:
    """The full vector on rank 0 (buffer-API Gatherv); None elsewhere."""
    counts = list(np.diff(offsets))
    if comm.size == 1:
        return local.copy()
    out = np.empty(offsets[-1]) if comm.rank == 0 else None
    comm.Gatherv([local, MPI.DOUBLE], [out, counts, MPI.DOUBLE] if comm.rank == 0 else None, root=0)
    return out


def _output_error(cfg: RunConfig) -> str | None:
    try:
        check_output(cfg)
    except ConfigError as e:
        return str(e)
    return None


class _StopFlag:
    """SIGTERM / SIGINT set a flag; the loop stops at the end of the iteration."""

    def __init__(self):
        self.raised = False
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass

    def _handle(self, signum, frame):
        self.raised = True

    def restore(self):
        for sig, h in self._old.items():
            signal.signal(sig, h)


def _collective(comm, make):
    """``make()`` on every rank (rank 0 may fail); its error, if any, raised on every rank."""
    from hpcpipe.run.results import ResultsError

    out, err = None, None
    try:
        out = make()
    except ResultsError as e:
        err = str(e)
    err = comm.bcast(err, root=0)
    if err:
        raise ResultsError(err)
    return out


def _reopen_writer(path: str, comm, last_iteration: int, overrides: dict | None):
    from hpcpipe.run.results import Writer

    if comm.rank != 0:
        return None
    return Writer.reopen(
        path,
        last_iteration,
        COLUMNS,
        log=lambda m: print(f"hpcpipe: {m}", file=sys.stderr, flush=True),
        overrides=overrides,
    )


def _open_writer(
    cfg: RunConfig, comm, prob: Problem, method: Method, T: int, size: int, n_stages: int
):
    from hpcpipe.run.results import Writer

    hosts = comm.gather(socket.gethostname(), root=0)
    if comm.rank != 0:
        return None
    attrs = {
        "config": cfg.to_json(),
        "method": json.dumps(
            {
                "name": method.name,
                "lr": method.lr,
                "gamma": method.gamma,
                "samples": method.samples,
                "momentum": method.momentum,
                "iterations": T,
            }
        ),
        "problem": json.dumps(
            {
                "name": prob.name,
                "dim": prob.dim,
                "f_star": prob.f_star,
                "L": prob.L,
                "beta": prob.beta,
                "R": prob.R,
            }
        ),
        "n_ranks": comm.size,
        "n_stages": n_stages,
        "executor": cfg.executor,
        "hosts": sorted(set(hosts)),
        "clock": cfg.clock,
    }
    for k, v in json.loads(cfg.to_json()).items():
        attrs[f"config.{k}"] = v
    return Writer(cfg.output, attrs, COLUMNS, n_stages, state_size=size)


def _flush(
    writer,
    comm,
    recorder: Recorder,
    rows: list,
    flushed: int,
    state: State,
    loop: dict,
    offsets: list[int],
) -> int:
    """Append new rows and gathered events, save the optimizer state, flush.

    The state (θ_t, θ_{t−1}, t, best f, pipeline time, first loss, per-stage
    totals) is what ``--resume`` needs to continue bitwise.
    """
    ev = recorder.gather(comm)
    theta = _gather_vector(state.theta, comm, offsets)
    prev = _gather_vector(state.prev, comm, offsets)
    stage = recorder.stage_summary(comm)
    if writer is not None:
        if len(rows) > flushed:
            writer.append_iterations(np.array(rows[flushed:], dtype=float))
        writer.append_timeline(ev)
        writer.save_state(theta, prev, [state.t, loop["best"], loop["mtime"], loop["first"]], stage)
        writer.flush()
    return len(rows)


def _restore(
    path: str, comm, state: State, loop: dict, recorder: Recorder, offsets: list[int]
) -> None:
    """Load the optimizer state of an incomplete result file on every rank."""
    from hpcpipe.run.results import ResultsError, read_state

    got = None
    if comm.rank == 0:
        try:
            got = read_state(path)
        except ResultsError as e:
            got = e
    got = comm.bcast(got, root=0)
    if isinstance(got, Exception):
        raise got
    theta, prev, scalars, stage = got
    r = comm.rank
    n_stages = recorder.engine.schedule.n_stages
    if theta.size != offsets[-1] or stage.shape[0] != n_stages:
        raise ResultsError(
            f"{path}: its state has {theta.size} values on {stage.shape[0]} "
            f"stages; this run has {offsets[-1]} on {n_stages}"
        )
    state.theta = theta[offsets[r] : offsets[r + 1]].copy()
    state.prev = prev[offsets[r] : offsets[r + 1]].copy()
    state.t = int(scalars[0])
    loop["best"], loop["mtime"], loop["first"] = (float(x) for x in scalars[1:4])
    recorder.restore(stage, r)


def gather_theta(result: RunResult, comm, problem: Problem) -> np.ndarray:
    """The whole final iterate on every rank (for tests and reports; not a hot path)."""
    parts = comm.allgather(result.theta)
    full = np.concatenate(parts)
    if problem.variable == "weights":
        assert full.size == stage_offsets(problem.spec, comm.size)[-1]
    return full
