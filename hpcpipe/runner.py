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

from .clocks import CostModel
from .config import ConfigError, RunConfig, check_output, validate
from .engine import Engine
from .model import stage_offsets
from .optim import Method, State, theory_plan
from .problems import Problem, attack, fewshot, l1_chain, max_chain, quad_chain
from .recording import Recorder

COLUMNS = (
    "iteration",
    "loss",
    "f",
    "best_f",
    "gap",
    "grad_norm",
    "step",
    "model_time",
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
                    f"loss {loss:.4g} t_model {mtime:.4g}"
                )
                sys.stderr.flush()
                self.last = now
            if force:
                sys.stderr.write("\n")
        elif force or now - self.last > 10.0:
            sys.stderr.write(
                f"{self.label}: iteration {it}/{self.total} loss {loss:.6g} "
                f"model time {mtime:.6g} wall {now - self.t0:.1f}s\n"
            )
            sys.stderr.flush()
            self.last = now


def run(
    cfg: RunConfig,
    comm=None,
    label: str | None = None,
    problem: Problem | None = None,
    on_iteration=None,
) -> RunResult:
    """Run one optimisation; returns the same RunResult on every rank (its own θ part)."""
    comm = comm if comm is not None else MPI.COMM_WORLD
    validate(cfg, comm.size, check_output=False)
    err = comm.bcast(_output_error(cfg) if comm.rank == 0 else None, root=0)
    if err:
        raise ConfigError(err)
    prob = problem if problem is not None else make_problem(cfg, comm)
    method, T = make_method(cfg, prob)
    costs = CostModel.uniform(cfg.depth, cfg.t_forward, cfg.t_backward, cfg.alpha, cfg.beta)
    common = dict(
        variable=prob.variable,
        schedule=cfg.schedule,
        seed=cfg.seed,
        clock=cfg.clock,
        costs=costs,
        wait=cfg.wait,
    )
    eng = Engine(
        comm,
        prob.spec,
        prob.batch,
        samples=method.samples,
        microbatches=cfg.n_micro,
        layer_time=cfg.layer_time,
        weights=prob.weights,
        **common,
    )
    ev = (
        Engine(
            comm,
            prob.spec,
            prob.batch,
            samples=1,
            microbatches=prob.batch.m,
            weights=prob.weights,
            **common,
        )
        if cfg.eval_every
        else None
    )
    project = prob.project if comm.rank == 0 else (lambda v: v)
    state = State(method, eng.initial_point(), project)
    red = np.zeros(3)
    recorder = Recorder(eng, cfg.timeline_limit, cfg.timeline_every, keep=bool(cfg.output))
    writer = _open_writer(cfg, comm, prob, method, T) if cfg.output else None
    flushed = 0
    stop = _StopFlag()
    rows = []
    f_star = prob.f_star if prob.f_star is not None else math.nan
    best, mtime, status, first = math.inf, 0.0, "complete", None
    prog = Progress(cfg.progress, T, label or f"{cfg.optimizer}", comm.rank == 0)
    wall0 = time.perf_counter()
    extra: dict = {}

    def exact_f(theta):
        res = ev.evaluate(theta)
        red[0] = 0.5 * prob.mu * float(theta @ theta)
        comm.Allreduce(MPI.IN_PLACE, [red[:1], MPI.DOUBLE], op=MPI.SUM)
        return res.loss + red[0], res.item_losses

    for it in range(1, T + 1):
        y = state.point()
        res = eng.evaluate(y, method.gamma, call=it)
        grad = res.grad + prob.mu * y if prob.mu else res.grad
        recorder.record(it, res.time)
        red[0] = 0.5 * prob.mu * float(y @ y)
        red[1] = float(grad @ grad)
        red[2] = 1.0 if stop.raised else 0.0
        comm.Allreduce(MPI.IN_PLACE, [red, MPI.DOUBLE], op=MPI.SUM)
        loss = res.loss + red[0]
        gnorm = math.sqrt(red[1])
        mtime += res.time
        if first is None:
            first = loss
        if (
            not math.isfinite(loss)
            or not math.isfinite(gnorm)
            or (loss - first > cfg.diverge_factor * max(abs(first), 1.0))
        ):
            status = "diverged"
            rows.append(
                (
                    it,
                    loss,
                    math.nan,
                    best,
                    math.nan,
                    gnorm,
                    method.lr,
                    mtime,
                    time.perf_counter() - wall0,
                )
            )
            break
        state.update(y, grad)
        f = math.nan
        if ev is not None and (it % cfg.eval_every == 0 or it == T):
            f, items = exact_f(state.theta)
            if not math.isfinite(f):
                status = "diverged"
            best = min(best, f)
            if prob.name == "attack":
                extra["attack_success"] = float((items < 0).mean())
        rows.append(
            (it, loss, f, best, f - f_star, gnorm, method.lr, mtime, time.perf_counter() - wall0)
        )
        if on_iteration is not None:
            on_iteration(rows[-1])
        prog.update(it, loss, mtime)
        if red[2] > 0:
            status = "incomplete"
        if cfg.output:
            if it % cfg.flush_every == 0 or status != "complete":
                flushed = _flush(writer, comm, recorder, rows, flushed)
        if status != "complete" or (cfg.time_budget and mtime >= cfg.time_budget):
            break
    stop.restore()
    prog.update(len(rows), rows[-1][1] if rows else math.nan, mtime, force=True)
    if cfg.output:
        flushed = _flush(writer, comm, recorder, rows, flushed)
        summary = recorder.stage_summary(comm)
        if writer is not None:
            writer.set_stages(
                summary[:, 0], summary[:, 1], summary[:, 2], summary[:, 3].astype(np.int64)
            )
            writer.close(status, {"info": json.dumps({**prob.info, **extra})})
    eng.close()
    if ev is not None:
        ev.close()
    extra.update(prob.info)
    extra["iterations_planned"] = T
    return RunResult(
        cfg,
        method,
        status,
        np.array(rows, dtype=float).reshape(-1, len(COLUMNS)),
        state.theta,
        extra,
    )


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


def _open_writer(cfg: RunConfig, comm, prob: Problem, method: Method, T: int):
    from .results import Writer

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
        "hosts": sorted(set(hosts)),
        "clock": cfg.clock,
    }
    for k, v in json.loads(cfg.to_json()).items():
        attrs[f"config.{k}"] = v
    return Writer(cfg.output, attrs, COLUMNS, comm.size)


def _flush(writer, comm, recorder: Recorder, rows: list, flushed: int) -> int:
    """Gather pending events, append new rows and events, flush; returns rows written."""
    ev = recorder.gather(comm)
    if writer is not None:
        if len(rows) > flushed:
            writer.append_iterations(np.array(rows[flushed:], dtype=float))
        writer.append_timeline(ev)
        writer.flush()
    return len(rows)


def gather_theta(result: RunResult, comm, problem: Problem) -> np.ndarray:
    """The whole final iterate on every rank (for tests and reports; not a hot path)."""
    parts = comm.allgather(result.theta)
    full = np.concatenate(parts)
    if problem.variable == "weights":
        assert full.size == stage_offsets(problem.spec, comm.size)[-1]
    return full
