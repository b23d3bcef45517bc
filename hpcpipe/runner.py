"""Drive an optimizer over the engine: one run, its per-iteration table, its status.

All ranks execute the same loop in lockstep; every decision (stop, diverge)
is taken on values that are identical on all ranks (the losses the engine
broadcasts and one Allreduce per iteration), so no rank is left waiting.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .clocks import CostModel
from .config import RunConfig, validate
from .engine import Engine
from .model import stage_offsets
from .optim import Method, State, theory_plan
from .problems import Problem, attack, fewshot, l1_chain, max_chain, quad_chain

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
    status: str  # complete | diverged
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
    validate(cfg, comm.size)
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
    red = np.zeros(2)
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
        red[0] = 0.5 * prob.mu * float(y @ y)
        red[1] = float(grad @ grad)
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
        if status != "complete" or (cfg.time_budget and mtime >= cfg.time_budget):
            break
    prog.update(len(rows), rows[-1][1] if rows else math.nan, mtime, force=True)
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


def gather_theta(result: RunResult, comm, problem: Problem) -> np.ndarray:
    """The whole final iterate on every rank (for tests and reports; not a hot path)."""
    parts = comm.allgather(result.theta)
    full = np.concatenate(parts)
    if problem.variable == "weights":
        assert full.size == stage_offsets(problem.spec, comm.size)[-1]
    return full
