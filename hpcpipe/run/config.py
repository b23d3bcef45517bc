"""Run configuration: defaults, TOML loading, ``--key value`` overrides, validation.

Every check runs before any MPI work starts; a bad value raises ConfigError
naming the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hpcpipe.errors import ConfigError
from hpcpipe.errors import need as _need
from hpcpipe.optim import OPTIMIZERS
from hpcpipe.pipeline.executors import EXECUTORS
from hpcpipe.pipeline.schedules import SCHEDULES
from hpcpipe.pipeline.transport import WAIT_POLICIES
from hpcpipe.problems import PROBLEMS

PROBLEM, OPTIMIZER, STOPPING, PIPELINE, OUTPUT, TESTING = (
    "problem",
    "optimizer",
    "stopping and evaluation",
    "pipeline and clock",
    "output",
    "testing",
)
GROUPS = (PROBLEM, OPTIMIZER, STOPPING, PIPELINE, OUTPUT, TESTING)


def setting(default, meaning: str, group: str):
    """A configuration key: its default, what it means (the help text) and its group."""
    return dataclasses.field(default=default, metadata={"help": meaning, "group": group})


@dataclass
class RunConfig:
    """Every setting of a run: the one schema that the CLI help, TOML files and checks read."""

    problem: str = setting("l1-chain", "problem to optimise", PROBLEM)
    depth: int = setting(4, "layers (blocks) of the model: depth Delta", PROBLEM)
    width: int = setting(32, "hidden width of the digits MLP (attack, fewshot)", PROBLEM)
    dim: int = setting(16, "dimension d of the convex chains", PROBLEM)
    m: int = setting(1, "examples per oracle call (images for the attack)", PROBLEM)
    microbatches: int = setting(
        0, "work items M per sample; 0 means one per example (M = m)", PROBLEM
    )
    schedule: str = setting("gpipe", "pipeline schedule of one oracle call", PIPELINE)
    optimizer: str = setting("pprs", "optimization method", OPTIMIZER)
    mode: str = setting(
        "practical", "theory: lr, iterations, gamma, samples follow from epsilon", OPTIMIZER
    )
    lr: float = setting(1e-2, "step size eta", OPTIMIZER)
    momentum: str = setting(
        "nesterov", "'nesterov' ((t-1)/(t+2)) or a constant momentum in [0, 1)", OPTIMIZER
    )
    gamma: float = setting(0.0, "smoothing radius gamma of PPRS (0: no smoothing)", OPTIMIZER)
    samples: int = setting(1, "smoothing samples K per iteration (PPRS)", OPTIMIZER)
    epsilon: float = setting(0.0, "target accuracy f - f* (theory mode plans from it)", OPTIMIZER)
    iterations: int = setting(100, "iterations T (theory mode: planned from epsilon)", STOPPING)
    time_budget: float = setting(0.0, "stop when the pipeline time reaches it (0: off)", STOPPING)
    seed: int = setting(0, "seed of the problem, the model and the noise", PROBLEM)
    radius: float = setting(0.1, "l-infinity radius of the attack", PROBLEM)
    clock: str = setting(
        "model", "clock of the pipeline time: model (tau units) or wall (s)", PIPELINE
    )
    executor: str = setting(
        "mpi",
        "mpi: one pipeline stage per MPI rank; simulated: one process, simulator time",
        PIPELINE,
    )
    stages: int = setting(
        0, "pipeline stages S; 0: the rank count (mpi) or the depth (simulated)", PIPELINE
    )
    t_forward: float = setting(1.0, "model cost of one layer's forward, in tau", PIPELINE)
    t_backward: float = setting(1.0, "model cost of one layer's backward, in tau", PIPELINE)
    alpha: float = setting(0.0, "model cost of a message: alpha + bytes * beta (alpha)", PIPELINE)
    beta: float = setting(0.0, "model cost of a message: alpha + bytes * beta (beta)", PIPELINE)
    layer_time: float = setting(
        0.0, "emulated compute per layer and action, in seconds (0: none)", PIPELINE
    )
    wait: str = setting("auto", "how a rank waits for a message", PIPELINE)
    eval_every: int = setting(1, "exact f(theta_t) every N iterations (0: never)", STOPPING)
    diverge_factor: float = setting(
        1e3, "diverged when the loss grows by this factor times max(|f0|, 1)", STOPPING
    )
    output: str = setting(
        "", "HDF5 result file (hpcpipe run: default runs/...; see --no-output)", OUTPUT
    )
    tag: str = setting("", "free label stored with the result (sweeps: the study)", OUTPUT)
    flush_every: int = setting(10, "iterations between HDF5 flushes", OUTPUT)
    timeline_limit: int = setting(50, "record every action of the first N iterations", OUTPUT)
    timeline_every: int = setting(10, "then record every N-th iteration", OUTPUT)
    progress: str = setting("auto", "progress display on rank 0", OUTPUT)
    timeout: float = setting(
        0.0, "watchdog: abort when a rank waits this long (s) for a message (0: off)", PIPELINE
    )
    inject_failure: str = setting(
        "", "'RANK:ITERATION' raises there, 'RANK:ITERATION:hang' stops there", TESTING
    )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def n_micro(self) -> int:
        return self.microbatches or self.m


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
# keys whose value names a registry entry (or a user's package.module:attribute)
REGISTRIES = {
    "problem": PROBLEMS,
    "optimizer": OPTIMIZERS,
    "executor": EXECUTORS,
    "schedule": SCHEDULES,
}
CHOICES = {
    "mode": ("practical", "theory"),
    "clock": ("model", "wall"),
    "wait": WAIT_POLICIES,
    "progress": ("auto", "bar", "lines", "off"),
}


def choices(name: str) -> tuple[str, ...] | None:
    """The values a key allows: a registry's own names (it also takes any
    ``package.module:attribute``) or a fixed list; None for a free value."""
    if name in REGISTRIES:
        return tuple(n for n in REGISTRIES[name].names() if ":" not in n)
    return CHOICES.get(name)


def _coerce(name: str, value):
    f = FIELDS[name]
    typ = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str}[f.type]
    if typ is int:
        if isinstance(value, bool) or not (
            isinstance(value, int)
            or (isinstance(value, str) and value.isascii() and value.lstrip("-").isdigit())
        ):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return int(value)
    if typ is float:
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return str(value)


def unknown_key(name: str) -> ConfigError:
    """The error for a key the schema does not have, naming the closest one."""
    close = difflib.get_close_matches(name, FIELDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown key {name!r}{hint}; known keys: {', '.join(FIELDS)}")


def make_config(values: dict) -> RunConfig:
    """RunConfig from a dict of settings, type-checked and validated."""
    kw = {}
    for k, v in values.items():
        key = k.replace("-", "_")
        if key not in FIELDS:
            raise unknown_key(k)
        kw[key] = _coerce(key, v)
    cfg = RunConfig(**kw)
    validate(cfg)
    return cfg


def load(path: str | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML file (flat keys, or a [run] table) and apply ``key=value`` overrides."""
    values: dict = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {path!r} does not exist or is not a file")
        try:
            data = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None
        values.update(data.get("run", data))
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: write key=value")
        k, v = item.split("=", 1)
        values[k.strip()] = v.strip()
    return make_config(values)


def check_output(cfg: RunConfig) -> None:
    """The output path must not hold a result already, and its folder must be writable."""
    if not cfg.output:
        return
    p = Path(cfg.output)
    if p.exists():
        raise ConfigError(
            f"output = {cfg.output!r} exists already: choose another path or "
            "delete it (results are never overwritten)"
        )
    parent = p.parent if str(p.parent) else Path(".")
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"output = {cfg.output!r}: folder {str(probe)!r} is not writable")


_check_output = check_output


def validate(cfg: RunConfig, n_ranks: int | None = None, check_output: bool = True) -> None:
    """All checks that can be made before any rank starts work."""
    for name, options in CHOICES.items():
        v = getattr(cfg, name)
        _need(v in options, name, v, f"choose one of {', '.join(options)}")
    for name, registry in REGISTRIES.items():
        v = getattr(cfg, name)
        err = registry.check(v)
        if err and ":" not in str(v):
            close = difflib.get_close_matches(str(v), choices(name), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            names = ", ".join(choices(name))
            err = f"choose one of {names}, or package.module:attribute{hint}"
        _need(err is None, name, v, err or "")
    problem, optimizer = PROBLEMS.get(cfg.problem), OPTIMIZERS.get(cfg.optimizer)
    for name in ("depth", "samples", "iterations", "m"):
        _need(getattr(cfg, name) >= 1, name, getattr(cfg, name), "must be >= 1")
    _need(cfg.dim >= 1, "dim", cfg.dim, "must be >= 1")
    _need(cfg.width >= 1, "width", cfg.width, "must be >= 1")
    _need(
        0 <= cfg.microbatches <= cfg.m,
        "microbatches",
        cfg.microbatches,
        f"between 1 and m = {cfg.m} (0 means m)",
    )
    for name in ("lr", "t_forward", "t_backward", "diverge_factor"):
        v = getattr(cfg, name)
        _need(math.isfinite(v) and v > 0, name, v, "must be a finite number > 0")
    if cfg.inject_failure:
        parts = cfg.inject_failure.split(":")
        ok = (
            len(parts) in (2, 3)
            and all(p.strip().isdigit() for p in parts[:2])
            and (len(parts) == 2 or parts[2] in ("raise", "hang"))
        )
        _need(
            ok,
            "inject_failure",
            cfg.inject_failure,
            "write RANK:ITERATION or RANK:ITERATION:hang, e.g. '2:5'",
        )
    for name in (
        "gamma",
        "epsilon",
        "time_budget",
        "alpha",
        "beta",
        "layer_time",
        "radius",
        "timeout",
    ):
        v = getattr(cfg, name)
        _need(math.isfinite(v) and v >= 0, name, v, "must be a finite number >= 0")
    _need(cfg.eval_every >= 0, "eval_every", cfg.eval_every, "must be >= 0 (0: never)")
    _need(cfg.flush_every >= 1, "flush_every", cfg.flush_every, "must be >= 1")
    _need(cfg.timeline_limit >= 0, "timeline_limit", cfg.timeline_limit, "must be >= 0")
    _need(cfg.timeline_every >= 1, "timeline_every", cfg.timeline_every, "must be >= 1")
    optimizer.check(cfg)
    problem.check(cfg)
    if cfg.mode == "theory":
        _need(cfg.epsilon > 0, "epsilon", cfg.epsilon, "theory mode needs a target epsilon > 0")
        _need(
            problem.theory,
            "problem",
            cfg.problem,
            "theory mode needs a problem with known L or beta and R (the chains)",
        )
        _need(
            optimizer.planned,
            "optimizer",
            cfg.optimizer,
            "theory mode has step rules for gd, agd and pprs only",
        )
    _check_executor(cfg, n_ranks)
    if n_ranks is not None and cfg.executor == "mpi":
        _need(
            cfg.depth >= n_ranks,
            "depth",
            cfg.depth,
            f"depth must be >= the number of ranks ({n_ranks}): every rank owns a layer",
        )
    if check_output:
        _check_output(cfg)


def _check_executor(cfg: RunConfig, n_ranks: int | None) -> None:
    """The stage count S and the settings each executor can honour."""
    _need(
        0 <= cfg.stages <= cfg.depth,
        "stages",
        cfg.stages,
        f"between 1 and depth = {cfg.depth} (every stage holds a layer; 0: the default)",
    )
    if cfg.executor == "mpi":
        if n_ranks is not None:
            _need(
                cfg.stages in (0, n_ranks),
                "stages",
                cfg.stages,
                f"the MPI engine runs one stage per rank: set stages = 0 or {n_ranks} "
                "(the rank count), or executor = 'simulated'",
            )
        return
    _need(
        n_ranks is None or n_ranks == 1,
        "executor",
        cfg.executor,
        f"the simulated pipeline runs in one process, not {n_ranks} ranks: "
        "launch it without --np/mpiexec and set its stage count with stages = S",
    )
    _need(
        cfg.clock == "model",
        "clock",
        cfg.clock,
        "the simulated pipeline times calls on the model clock: set clock = 'model'",
    )
    _need(
        cfg.layer_time == 0,
        "layer_time",
        cfg.layer_time,
        "emulated compute needs real ranks: set layer_time = 0 or executor = 'mpi'",
    )
