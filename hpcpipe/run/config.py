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
import re
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
from hpcpipe.pipeline.wait import WAIT_POLICIES
from hpcpipe.problems import PROBLEMS
from hpcpipe.run.resources import MLP_PROBLEMS, memory_error

PROBLEM, OPTIMIZER, STOPPING, PIPELINE, OUTPUT, TESTING = (
    "problem",
    "optimizer",
    "stopping and evaluation",
    "pipeline and clock",
    "output",
    "testing",
)
GROUPS = (PROBLEM, OPTIMIZER, STOPPING, PIPELINE, OUTPUT, TESTING)


# PPRS's practical defaults (mode = "practical", keys not given): K = 10 samples of radius
# gamma = 0.01, the K of the few-shot study (jobs/sweeps/paper-gamma.toml) and the middle of
# its gamma grid. With K = 1 and gamma = 0 PPRS's update (Colin et al. 2019, Alg. 1) is
# AGD's, bit for bit: a default that means PPRS must smooth.
PPRS_SAMPLES = 10
PPRS_GAMMA = 0.01


def shown_default(f: dataclasses.Field) -> str:
    """A key's default as the help and the reference state it (some depend on the run)."""
    if "shown" in f.metadata:
        return f.metadata["shown"]
    return str(f.default) if f.default != "" else '""'


def setting(default, meaning: str, group: str):
    """A configuration key: its default, what it means (the help text) and its group."""
    return dataclasses.field(default=default, metadata={"help": meaning, "group": group})


@dataclass
class RunConfig:
    """Every setting of a run: the one schema that the CLI help, TOML files and checks read."""

    problem: str = setting("l1-chain", "problem to optimise", PROBLEM)
    depth: int = dataclasses.field(
        default=4,
        metadata={
            "help": "layers (blocks) of the model: depth Delta",
            "group": PROBLEM,
            "shown": "4, or the rank count when more ranks run (mpi executor)",
        },
    )
    width: int = setting(32, "hidden width of the digits MLP (attack, fewshot)", PROBLEM)
    dim: int = setting(16, "dimension d of the convex chains", PROBLEM)
    layers: str = setting(
        "dense",
        "orthogonal layers of the chains: dense (d x d each) or householder (O(d) each)",
        PROBLEM,
    )
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
        "nesterov",
        "'nesterov' ((t-1)/(t+2)), 'acsa' (PPRS: AC-SA's update) or a constant in [0, 1)",
        OPTIMIZER,
    )
    gamma: float = dataclasses.field(
        default=0.0,
        metadata={
            "help": "smoothing radius gamma of PPRS (0: no smoothing)",
            "group": OPTIMIZER,
            "shown": f"{PPRS_GAMMA} for pprs, 0 for gd and agd",
        },
    )
    samples: int = dataclasses.field(
        default=1,
        metadata={
            "help": "smoothing samples K per iteration (PPRS)",
            "group": OPTIMIZER,
            "shown": f"{PPRS_SAMPLES} for pprs, 1 for gd and agd",
        },
    )
    epsilon: float = setting(0.0, "target accuracy f - f* (theory mode plans from it)", OPTIMIZER)
    iterations: int = setting(100, "iterations T (theory mode: planned from epsilon)", STOPPING)
    time_budget: float = setting(0.0, "stop when the pipeline time reaches it (0: off)", STOPPING)
    stop_at_epsilon: int = setting(
        0,
        "1: stop at the first evaluation with f - f* <= epsilon (time to epsilon; 0: off)",
        STOPPING,
    )
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
    alpha_intra: float = setting(
        0.0, "wall-clock prediction: latency (s) of a message inside a node", PIPELINE
    )
    beta_intra: float = setting(
        0.0, "wall-clock prediction: seconds per byte of a message inside a node", PIPELINE
    )
    alpha_inter: float = setting(
        0.0, "wall-clock prediction: latency (s) of a message between nodes", PIPELINE
    )
    beta_inter: float = setting(
        0.0, "wall-clock prediction: seconds per byte of a message between nodes", PIPELINE
    )
    wait: str = setting("auto", "how a rank waits for a message", PIPELINE)
    machine: str = setting(
        "",
        "machine profile (TOML from hpcpipe calibrate): model costs in seconds, not tau",
        PIPELINE,
    )
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
        -1.0,
        "watchdog: end the run, naming the lost ranks, when a rank waits this long (s) on "
        "a peer (0: off; -1: auto, off outside Slurm, in a Slurm job max(60 s, 50 x the "
        "predicted iteration time))",
        PIPELINE,
    )
    inject_failure: str = setting(
        "",
        "'RANK:ITERATION' raises there, 'RANK:ITERATION:hang' stops there, "
        "'enospc:ITERATION' / 'edquot:ITERATION': the disk is full / over quota at its flush",
        TESTING,
    )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def n_micro(self) -> int:
        return self.microbatches or self.m


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
DISK_FAULTS = ("enospc", "edquot")  # inject_failure kinds: the result file's disk is full
# keys whose value names a registry entry (or a user's package.module:attribute)
REGISTRIES = {
    "problem": PROBLEMS,
    "optimizer": OPTIMIZERS,
    "executor": EXECUTORS,
    "schedule": SCHEDULES,
}
CHOICES = {
    "mode": ("practical", "theory"),
    "layers": ("dense", "householder"),
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


INT_MAX = 2**63 - 1  # every integer setting must fit a C int64 (numpy, HDF5 attributes)
_INT = re.compile(r"[+-]?[0-9]+")


def _coerce(name: str, value):
    """A setting's value in its type: integers in ASCII digits within int64, finite-or-not
    floats in ASCII, strings without control characters."""
    f = FIELDS[name]
    typ = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str}[f.type]
    if typ is int:
        text = value.strip() if isinstance(value, str) else None
        if isinstance(value, bool) or not (
            isinstance(value, int) or (text is not None and _INT.fullmatch(text))
        ):
            raise ConfigError(f"{name}: expected an integer, got {value!r}{_ascii_note(value)}")
        v = int(value)
        if abs(v) > INT_MAX:
            raise ConfigError(f"{name}: {_short(value)} is too large (at most {INT_MAX})")
        return v
    if typ is float:
        if isinstance(value, str) and not (value.strip() and value.isascii()):
            raise ConfigError(f"{name}: expected a number, got {value!r}{_ascii_note(value)}")
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except OverflowError:
            raise ConfigError(f"{name}: {_short(value)} is too large for a number") from None
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigError(f"{name}: {text!r} holds a control character (newline, tab, ...)")
    return text


def _ascii_note(value) -> str:
    return "" if not isinstance(value, str) or value.isascii() else " (ASCII digits 0-9 only)"


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 30 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


def unknown_key(name: str) -> ConfigError:
    """The error for a key the schema does not have, naming the closest one."""
    close = difflib.get_close_matches(name, FIELDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown key {name!r}{hint}; known keys: {', '.join(FIELDS)}")


def run_defaults(kw: dict, ranks: int | None = None) -> dict:
    """The defaults that depend on other settings, for the keys ``kw`` does not give.

    * ``optimizer = "pprs"`` in practical mode: ``samples = PPRS_SAMPLES`` and
      ``gamma = PPRS_GAMMA`` (theory mode plans both from epsilon);
    * ``depth``: 4, or the rank count when ``ranks`` (known before the run) is larger
      and the executor is mpi, where every rank owns at least one layer.
    """
    out = {}
    practical = kw.get("mode", FIELDS["mode"].default) == "practical"
    if kw.get("optimizer", FIELDS["optimizer"].default) == "pprs" and practical:
        if "samples" not in kw:
            out["samples"] = PPRS_SAMPLES
        if "gamma" not in kw:
            out["gamma"] = PPRS_GAMMA
    executor = kw.get("executor", FIELDS["executor"].default)
    if "depth" not in kw and ranks and executor == "mpi" and ranks > FIELDS["depth"].default:
        out["depth"] = ranks
    return out


def make_config(values: dict, ranks: int | None = None, check_profile: bool = True) -> RunConfig:
    """RunConfig from a dict of settings, type-checked and validated; keys not given take
    their defaults (``run_defaults``: some follow the optimizer or the rank count);
    ``check_profile`` False: the machine profile is not read (``validate``)."""
    kw = {}
    for k, v in values.items():
        key = k.replace("-", "_")
        if key not in FIELDS:
            raise unknown_key(k)
        kw[key] = _coerce(key, v)
    kw.update(run_defaults(kw, ranks))
    cfg = RunConfig(**kw)
    validate(cfg, check_profile=check_profile)
    return cfg


def load(
    path: str | None, overrides: list[str] | None = None, ranks: int | None = None
) -> RunConfig:
    """Read a TOML file (flat keys, or a [run] table) and apply ``key=value`` overrides;
    ``ranks``, when known, sets the default depth (``run_defaults``)."""
    values: dict = {}
    if path:
        check_path("config file", path, write=False)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {path!r} does not exist or is not a file")
        try:
            data = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as e:
            raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None
        if "run" in data:
            if not isinstance(data["run"], dict):
                raise ConfigError(f"config file {path!r}: run must be a [run] table")
            flat = sorted(set(data) - {"run"})
            if flat:
                raise ConfigError(
                    f"config file {path!r}: key(s) {', '.join(flat)} beside the [run] table "
                    "would be ignored: put every setting inside [run] (or use no [run] table)"
                )
            data = data["run"]
        values.update(data)
    for item in overrides or []:
        if "=" not in item:
            if Path(item).suffix or "/" in item:  # a path, not a setting
                there = "it exists" if Path(item).is_file() else "no such file"
                raise ConfigError(
                    f"{_shown(item)} is not a key=value override; a config file goes after "
                    f"--config ({there})"
                )
            raise ConfigError(f"override {item!r}: write key=value")
        k, v = item.split("=", 1)
        values[k.strip()] = v.strip()
    return make_config(values, ranks)


def _shown(path: str) -> str:
    """A path for a one-line message: a very long one keeps its two ends."""
    return repr(path) if len(path) <= 80 else repr(path[:36] + "..." + path[-36:])


def _limits(folder: str) -> tuple[int, int]:
    """(longest file name, longest path) in bytes on ``folder``'s file system."""
    out = []
    for key, default in (("PC_NAME_MAX", 255), ("PC_PATH_MAX", 4096)):
        try:
            out.append(int(os.pathconf(folder, key)))
        except (OSError, ValueError):
            out.append(default)
    return out[0], out[1]


def path_error(field: str, path: str, *, write: bool) -> str | None:
    """Why the operating system would refuse ``path`` as the setting ``field``, or None.

    Checked before any work, without creating anything: a name longer than the file
    system's NAME_MAX or a path longer than its PATH_MAX (ENAMETOOLONG), a part of
    the path that is a file (ENOTDIR), a folder that cannot be searched, or for a
    ``write`` path written (EACCES), a symbolic-link loop (ELOOP). A path that does not
    exist yet is fine here (its caller says whether it must); for a ``write`` path its
    nearest existing folder must then be a writable folder, and the names to create
    must fit. The message is one line: the field, the path, what is wrong, the fix.
    ``folder`` is the fix's "a shorter ..." noun (default: "path").
    """
    import errno
    import stat

    where = f"{field} = {_shown(path)}"
    want = "write" if write else "read"

    def why(code: int, at: str) -> str:
        name_max, path_max = _limits(at if os.path.isdir(at) else ".")
        if code == errno.ENAMETOOLONG:
            return (
                f"{where}: a name in it is longer than the file system allows ({name_max} "
                f"bytes a name, {path_max} a path): choose a shorter path"
            )
        if code == errno.ENOTDIR:
            return f"{where}: a part of it is a file, not a folder: choose a path under a folder"
        if code in (errno.EACCES, errno.EPERM):
            return f"{where}: permission denied on {_shown(at)}: choose a path you may {want}"
        if code == errno.ELOOP:
            return f"{where}: a loop of symbolic links: fix the link or choose another path"
        return f"{where}: {os.strerror(code)}: choose another path"

    if not path or "\0" in path:
        return f"{where}: give a path (an empty path or one with a NUL byte cannot be opened)"
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            return why(e.errno or 0, path)
    else:
        if not os.access(path, os.W_OK if write else os.R_OK):
            return why(errno.EACCES, path)
        if write and stat.S_ISDIR(st.st_mode) and not os.access(path, os.X_OK):
            return why(errno.EACCES, path)
        return None
    # missing: the nearest existing ancestor must be a folder, and the names to make fit
    full = os.path.abspath(path)
    anc = os.path.dirname(full)
    while True:
        try:
            st = os.stat(anc)
            break
        except OSError as e:
            if e.errno != errno.ENOENT or anc == os.path.dirname(anc):
                return why(e.errno or 0, anc)
            anc = os.path.dirname(anc)
    if not stat.S_ISDIR(st.st_mode):
        return why(errno.ENOTDIR, anc)
    name_max, path_max = _limits(anc)
    new = Path(full).relative_to(anc).parts
    if any(len(os.fsencode(n)) > name_max for n in new) or len(os.fsencode(full)) >= path_max:
        return why(errno.ENAMETOOLONG, anc)
    if write and not os.access(anc, os.W_OK | os.X_OK):
        return why(errno.EACCES, anc)
    return None


def check_path(field: str, path: str, *, write: bool) -> None:
    """``path_error`` as a ConfigError (exit status 2 in the CLI)."""
    err = path_error(field, path, write=write)
    if err:
        raise ConfigError(err)


def check_output(cfg: RunConfig) -> None:
    """The output path must be new, a file name in a folder that is one (or can be made),
    and writable; a dangling symbolic link is refused (HDF5 would fail later)."""
    if not cfg.output:
        return
    check_path("output", cfg.output, write=True)
    p = Path(cfg.output)
    if p.is_symlink() and not p.exists():
        raise ConfigError(f"output = {cfg.output!r} is a dangling symbolic link")
    if p.is_dir():
        raise ConfigError(f"output = {cfg.output!r} is a folder: give a file name")
    if p.exists():
        raise ConfigError(
            f"output = {cfg.output!r} exists already: choose another path or "
            "delete it (results are never overwritten)"
        )
    parent = p.parent if str(p.parent) else Path(".")
    probe = parent
    while not probe.exists() and not probe.is_symlink():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(
            f"output = {cfg.output!r}: {str(probe)!r} is a file or a dangling link, not a folder"
        )
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"output = {cfg.output!r}: folder {str(probe)!r} is not writable")


_check_output = check_output


def refuse_recorded_code(values: dict, given: dict, path: str, trusted: bool) -> None:
    """A ``package.module:attribute`` that a file records (``values``) is imported only when
    the user names it again on the command line (``given``) or trusts the file; call this
    before anything resolves the names (``make_config`` does)."""
    from hpcpipe.registry import is_reference, untrusted_message

    for key, registry in REGISTRIES.items():
        name = values.get(key)
        if is_reference(name) and not trusted and given.get(key) != name:
            raise ConfigError(untrusted_message(registry.what, name, path))


def validate(
    cfg: RunConfig,
    n_ranks: int | None = None,
    check_output: bool = True,
    check_profile: bool = True,
) -> None:
    """All checks that can be made before any rank starts work; ``check_profile`` False
    leaves the machine profile unread (one made later, e.g. on a cluster's allocation)."""
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
        cfg.layers == "dense" or cfg.problem not in MLP_PROBLEMS,
        "layers",
        cfg.layers,
        f"{cfg.problem} trains a ReLU MLP: layers = 'householder' is for the chain problems",
    )
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
        parts = [x.strip() for x in cfg.inject_failure.split(":")]
        disk = len(parts) == 2 and parts[0] in DISK_FAULTS
        ok = disk or (
            len(parts) in (2, 3)
            and all(re.fullmatch(r"[0-9]{1,18}", x) for x in parts[:2])
            and (len(parts) == 2 or parts[2] in ("raise", "hang"))
        )
        ok = ok and re.fullmatch(r"[0-9]{1,18}", parts[1]) is not None
        _need(
            ok,
            "inject_failure",
            cfg.inject_failure,
            "write RANK:ITERATION, RANK:ITERATION:hang, enospc:ITERATION or "
            "edquot:ITERATION, e.g. '2:5'",
        )
        rank, it = 0 if disk else int(parts[0]), int(parts[1])
        if n_ranks is not None:
            _need(
                rank < n_ranks,
                "inject_failure",
                cfg.inject_failure,
                f"rank {rank} does not exist: the run has ranks 0..{n_ranks - 1}",
            )
        if cfg.mode == "practical":
            _need(
                1 <= it <= cfg.iterations,
                "inject_failure",
                cfg.inject_failure,
                f"iteration {it} never comes: the run has iterations 1..{cfg.iterations}",
            )
    _need(0 <= cfg.seed <= INT_MAX, "seed", cfg.seed, f"a whole number in 0..{INT_MAX}")
    for name in (
        "gamma",
        "epsilon",
        "time_budget",
        "alpha",
        "beta",
        "layer_time",
        "alpha_intra",
        "beta_intra",
        "alpha_inter",
        "beta_inter",
        "radius",
    ):
        v = getattr(cfg, name)
        _need(math.isfinite(v) and v >= 0, name, v, "must be a finite number >= 0")
    _need(
        math.isfinite(cfg.timeout) and (cfg.timeout >= 0 or cfg.timeout == -1),
        "timeout",
        cfg.timeout,
        "must be a number of seconds > 0, 0 (off) or -1 (auto)",
    )
    _need(cfg.eval_every >= 0, "eval_every", cfg.eval_every, "must be >= 0 (0: never)")
    _need(cfg.stop_at_epsilon in (0, 1), "stop_at_epsilon", cfg.stop_at_epsilon, "0 or 1")
    if cfg.stop_at_epsilon:
        _need(cfg.epsilon > 0, "epsilon", cfg.epsilon, "stop_at_epsilon = 1 needs epsilon > 0")
        _need(
            cfg.eval_every >= 1,
            "eval_every",
            cfg.eval_every,
            "stop_at_epsilon = 1 needs evaluations of f (eval_every >= 1)",
        )
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
    if cfg.machine:
        check_machine(cfg, n_ranks, read_profile=check_profile)
    _check_schedule(cfg, n_ranks)
    if n_ranks is not None and cfg.executor == "mpi":
        _need(
            cfg.depth >= n_ranks,
            "depth",
            cfg.depth,
            f"depth must be >= the number of ranks ({n_ranks}): every rank owns a layer",
        )
    err = memory_error(cfg, n_ranks)
    if err:
        raise ConfigError(err)
    if check_output:
        _check_output(cfg)


def _check_schedule(cfg: RunConfig, n_ranks: int | None) -> None:
    """A built-in schedule must build for this run: its stage count fits the depth, and
    the builder's own rules hold (e.g. interleaved-1f1b's rounds must split the items).
    Every built-in runs on MPI; a placement of several stages per rank with the weights
    as variable is refused when the engine is built."""
    from hpcpipe.pipeline.schedules import ScheduleError, build

    if ":" in str(cfg.schedule) or cfg.schedule not in SCHEDULES.names():
        return
    if cfg.schedule in ("sequential", "gpipe", "1f1b"):
        return  # one stage per rank and any item count: nothing to check (and S can be large)
    P = n_ranks if cfg.executor == "mpi" else (cfg.stages or cfg.depth)
    # the item counts of the run's oracle calls: the optimizer's, and the evaluations'
    counts = {cfg.samples * (cfg.microbatches or cfg.m)} | ({cfg.m} if cfg.eval_every else set())
    if P is None:  # ranks not known yet (before the launch): the placement alone
        P, counts = 2, {2}
    try:
        for n in sorted(counts):
            sch = build(cfg.schedule, P, n)
    except ScheduleError as e:
        raise ConfigError(f"schedule = {cfg.schedule!r}: {e}") from None
    _need(
        sch.n_stages <= cfg.depth,
        "schedule",
        cfg.schedule,
        f"it makes {sch.n_stages} stages of {P} ranks and depth = {cfg.depth}: every stage "
        f"holds a layer, so set stages (ranks) <= {cfg.depth * P // sch.n_stages} or raise depth",
    )


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
                f"the MPI engine's stages are its ranks' (as the schedule places them): "
                f"set stages = 0 or {n_ranks} "
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
        cfg.executor != "reduced" or cfg.layers == "householder",
        "layers",
        cfg.layers,
        "executor = 'reduced' computes on the first block of a Householder chain: set "
        "layers = 'householder' or executor = 'simulated'",
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


# τ-unit cost settings a machine profile replaces, with their defaults
PROFILE_REPLACES = ("t_forward", "t_backward", "alpha", "beta")


def machine_ranks(cfg: RunConfig, n_ranks: int | None) -> int | None:
    """The rank count a profile must have been calibrated at: the MPI ranks, or the
    simulated pipeline's stages (the run it predicts); None when not known yet."""
    if cfg.executor == "mpi":
        return n_ranks
    return cfg.stages or cfg.depth


def machine_policy(cfg: RunConfig, ranks: int) -> str:
    """The wait policy a run of ``ranks`` ranks uses (``auto`` resolved on this machine)."""
    from hpcpipe.pipeline.transport import Waiter

    return Waiter(cfg.wait, ranks).policy


def check_machine(cfg: RunConfig, n_ranks: int | None, read_profile: bool = True) -> None:
    """The profile reads and fits the run: rank count, MPI library, wait policy, emulation;
    the τ-unit cost settings it replaces are left at their defaults (checked alone when
    ``read_profile`` is False)."""
    from hpcpipe.machine.profile import read
    from hpcpipe.mpi_library import library_name

    for name in PROFILE_REPLACES:
        default = FIELDS[name].default
        _need(
            getattr(cfg, name) == default,
            name,
            getattr(cfg, name),
            f"the machine profile sets the model costs: leave {name} at {default} or drop machine",
        )
    if not read_profile:
        return
    profile = read(cfg.machine)
    ranks = machine_ranks(cfg, n_ranks)
    if ranks is None:
        profile.check_run(profile.ranks, machine_policy(cfg, profile.ranks), cfg.layer_time, "")
        return
    library = library_name()
    profile.check_run(ranks, machine_policy(cfg, ranks), cfg.layer_time, library)
