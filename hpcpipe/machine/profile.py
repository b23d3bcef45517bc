"""Machine profiles: the cost model of one machine, rank count and placement, in seconds.

A profile is a plain TOML file written by ``hpcpipe calibrate`` (and editable
by hand). With ``machine = PROFILE`` the model clock and the simulator charge

* an action of one block: the profile's measured forward / backward time of
  the block's layer kind at the run's width (plus the measured duration of
  the emulated ``layer_time`` when the run emulates layers);
* the Gaussian smoothing noise of a run that smooths its input (PPRS, γ ≠ 0, the
  input as variable): the first stage draws Z_k for each sample at its first
  forward (``engine.evaluate``, ``rng.noise``); the profile's measured draw of
  one item (``noise``) is added to the first block's forward;
* a message of n payload bytes: α + n·β of the run's wait policy, fitted on
  the relay of that policy at the profile's rank count (docs in
  ``calibrate``), which includes waking the receiving rank;

instead of the τ-unit settings ``t_forward``, ``t_backward``, ``alpha`` and
``beta``. The clocks' rule (an action starts at max(stage clock, send stamp +
α + n·β)) is unchanged, so the model clock still equals the simulator bitwise.

Blocks that are not square at the calibrated width (an MLP's first and last
blocks) are charged by the cost of a dense product, which grows with
rows·n_in·n_out: t_block = t(w)·(rows·n_in·n_out)/(rows_cal·w²), w the
model's width. This is exact for the square blocks of the calibrated width
and rows, an estimate otherwise (the profile's layer rows say what was measured).

Schema (``SCHEMA = 1``)::

    schema = 1
    [machine]    host, cores, mpi_library, date, load_start, load_end, foreign_cpu, busy
                 (load above the cores during calibration), busy_note, hpcpipe,
                 command, seconds
    [placement]  ranks, hosts, ranks_per_host
    [message.<wait policy>]  alpha (s), beta (s/byte), residual, sizes (bytes),
                 hop_seconds (measured medians), wakeup (s), action_overhead (s per
                 action, optional: 0 when absent)
    [[layers]]   kind, width, rows, forward (s), backward (s), spread, noise (s to draw
                 one item's Gaussian smoothing noise, rows × width values; optional:
                 0 when absent, i.e. profiles written before it predict smoothed
                 runs without the draw)
    [emulated]   layer_time (s, as set), sleep (s, measured duration), spread

Every field is checked on reading; a bad one is named in a one-line
ConfigError with the fix.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from hpcpipe.errors import ConfigError
from hpcpipe.pipeline.clocks import CostModel

SCHEMA = 1
POLICIES = ("busy", "yield", "sleep")
KINDS = ("orthogonal", "dense", "mlp")


@dataclass(frozen=True)
class MessageCost:
    """α + n·β of one wait policy, the fit's relative RMS residual and what it was fit to."""

    alpha: float
    beta: float
    residual: float
    sizes: tuple[int, ...]
    hop_seconds: tuple[float, ...]
    wakeup: float
    action_overhead: float = 0.0


@dataclass(frozen=True)
class LayerCost:
    """Measured forward and backward time of one block of ``kind`` at ``width`` × ``width``."""

    kind: str
    width: int
    rows: int
    forward: float
    backward: float
    spread: float = 0.0
    noise: float = 0.0


@dataclass(frozen=True)
class Emulated:
    """The measured duration ``sleep`` of one emulated action of ``layer_time`` seconds."""

    layer_time: float
    sleep: float
    spread: float = 0.0


@dataclass
class MachineProfile:
    """A parsed, checked profile (see the module docstring for the schema)."""

    machine: dict
    ranks: int
    hosts: tuple[str, ...]
    ranks_per_host: int
    messages: dict[str, MessageCost]
    layers: list[LayerCost] = field(default_factory=list)
    emulated: Emulated | None = None
    path: str = ""
    text: str = ""

    @property
    def mpi_library(self) -> str:
        return str(self.machine.get("mpi_library", ""))

    @property
    def busy(self) -> bool:
        """Calibrated on a busy machine (load above the cores: ``calibrate.busy_note``)."""
        return self.machine.get("busy") is True

    @property
    def busy_note(self) -> str:
        """One line for a run or a report that uses a profile calibrated under load."""
        if not self.busy:
            return ""
        note = self.machine.get("busy_note")
        return str(note) if isinstance(note, str) and note else "calibrated on a busy machine"

    # ------------------------------------------------------------ lookups
    def message(self, policy: str) -> MessageCost:
        """The message cost of a (resolved) wait policy; ConfigError naming the field."""
        if policy not in self.messages:
            have = ", ".join(sorted(self.messages)) or "none"
            raise ConfigError(
                f"{self._where()}message.{policy}: the profile has no message cost for wait "
                f"policy {policy!r} (it has: {have}); calibrate with --wait {policy} or run "
                f"with one of those policies (--wait)"
            )
        return self.messages[policy]

    def layer(self, kind: str, width: int) -> LayerCost:
        """The layer cost of ``kind`` at ``width``; ConfigError naming the field otherwise."""
        for c in self.layers:
            if c.kind == kind and c.width == width:
                return c
        have = ", ".join(f"{c.kind}@{c.width}" for c in self.layers) or "none"
        raise ConfigError(
            f"{self._where()}layers: no {kind} layer of width {width} was calibrated "
            f"(the profile has: {have}); calibrate with --kinds {kind} --width {width}"
        )

    def _where(self) -> str:
        return f"machine profile {self.path}: " if self.path else "machine profile: "

    # ------------------------------------------------------------ checks against a run
    def check_run(self, ranks: int, policy: str, layer_time: float, mpi_library: str) -> None:
        """Refuse a run this profile was not measured for (ConfigError naming the field)."""
        where = self._where()
        if ranks != self.ranks:
            raise ConfigError(
                f"{where}placement.ranks = {self.ranks} but the run has {ranks} ranks "
                f"(stages): costs depend on the rank count; calibrate with --np {ranks}"
            )
        if mpi_library and self.mpi_library != mpi_library:
            raise ConfigError(
                f"{where}machine.mpi_library = {self.mpi_library!r} but this run uses "
                f"{mpi_library!r}: calibrate again with this MPI library"
            )
        self.message(policy)
        if layer_time > 0:
            if self.emulated is None:
                raise ConfigError(
                    f"{where}emulated: the run emulates layer_time = {layer_time:g} s but the "
                    f"profile has no [emulated] entry; calibrate with --layer-time {layer_time:g}"
                )
            if self.emulated.layer_time != layer_time:
                raise ConfigError(
                    f"{where}emulated.layer_time = {self.emulated.layer_time:g} but the run "
                    f"has layer_time = {layer_time:g}; calibrate with --layer-time {layer_time:g}"
                )

    def cost_model(
        self,
        spec,
        rows: int,
        policy: str,
        layer_time: float = 0.0,
        stages: int = 0,
        input_noise: bool = False,
    ) -> CostModel:
        """Per-block (t_F, t_B) and the message α, β of ``policy`` for model ``spec``, seconds.

        Block b of dims n_b × n_{b+1}: t = t(kind, w)·(rows·n_b·n_{b+1})/(rows_cal·w²)
        with w the model's width (``width``, or d for a chain; it must have been
        calibrated), plus the emulated action's measured duration, plus the engine's
        action overhead o of the policy spread over the blocks of a stage
        (o·stages/depth per block; ``stages`` 0: one block per stage).

        ``input_noise`` (a run that smooths its input: γ ≠ 0, variable = input): the
        first block's forward also draws the sample's noise Z_k of rows × d_in values,
        charged t_noise(kind, w)·(rows·d_in)/(rows_cal·w) (exact at the calibrated
        width and rows; 0 for a profile that predates the ``noise`` field).
        """
        msg = self.message(policy)
        if getattr(spec, "kind", None) not in KINDS:
            raise ConfigError(
                f"{self._where()}layers: the model's blocks are not a built-in kind "
                f"({', '.join(KINDS)}); a profile times only those: run without machine"
            )
        dims = spec.dims()
        w = spec.width or spec.d_in
        cal = self.layer(spec.kind, w)
        extra = 0.0
        if layer_time > 0:
            self.check_run(self.ranks, policy, layer_time, "")
            extra = self.emulated.sleep  # type: ignore[union-attr]
        extra += msg.action_overhead * (stages or spec.depth) / spec.depth
        tf, tb = [], []
        for b in range(spec.depth):
            scale = (rows * dims[b] * dims[b + 1]) / (cal.rows * w * w)
            tf.append(cal.forward * scale + extra)
            tb.append(cal.backward * scale + extra)
        if input_noise:
            tf[0] += cal.noise * (rows * dims[0]) / (cal.rows * w)
        return CostModel(tuple(tf), tuple(tb), msg.alpha, msg.beta)


# ---------------------------------------------------------------- reading
def _num(data: dict, key: str, where: str, integer: bool = False, positive: bool = False):
    if key not in data:
        raise ConfigError(f"{where}{key}: missing; write {key} = <number>")
    v = data[key]
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{where}{key} = {v!r} is not allowed: {kind} expected")
    v = int(v) if integer else float(v)
    if not math.isfinite(v) or v < 0 or (positive and v <= 0):
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"{where}{key} = {v!r} is not allowed: a finite number {bound}")
    return v


def _table(data: dict, key: str, where: str, required: bool = True) -> dict | None:
    if key not in data:
        if not required:
            return None
        raise ConfigError(f"{where}[{key}]: missing table; recalibrate with hpcpipe calibrate")
    if not isinstance(data[key], dict):
        raise ConfigError(f"{where}{key}: must be a [{key}] table")
    return data[key]


def _numbers(data: dict, key: str, where: str, integer: bool = False) -> tuple:
    v = data.get(key, [])
    if not isinstance(v, list):
        raise ConfigError(f"{where}{key} = {v!r} is not allowed: a list of numbers expected")
    return tuple(_num({key: x}, key, where, integer) for x in v)


def parse(text: str, path: str = "") -> MachineProfile:
    """A checked MachineProfile from TOML text; ConfigError naming the first bad field."""
    pre = f"machine profile {path}: " if path else "machine profile: "
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise ConfigError(f"{pre}not valid TOML: {e}") from None
    if data.get("schema") != SCHEMA:
        raise ConfigError(
            f"{pre}schema = {data.get('schema')!r} is not allowed: this hpcpipe reads schema "
            f"{SCHEMA}; recalibrate with hpcpipe calibrate"
        )
    machine = _table(data, "machine", pre)
    if not isinstance(machine.get("mpi_library"), str) or not machine["mpi_library"]:
        raise ConfigError(f"{pre}machine.mpi_library: missing; write the MPI library's name")
    if "busy" in machine and not isinstance(machine["busy"], bool):
        raise ConfigError(f"{pre}machine.busy = {machine['busy']!r} is not allowed: true or false")
    place = _table(data, "placement", pre)
    ranks = _num(place, "ranks", pre + "placement.", integer=True, positive=True)
    hosts = place.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise ConfigError(f"{pre}placement.hosts = {hosts!r} is not allowed: a list of names")
    per_host = _num(place, "ranks_per_host", pre + "placement.", integer=True, positive=True)
    msgs = _table(data, "message", pre)
    if not msgs:
        raise ConfigError(f"{pre}[message]: no wait policy measured; add [message.sleep] etc.")
    messages = {}
    for pol, m in msgs.items():
        where = f"{pre}message.{pol}."
        if pol not in POLICIES:
            raise ConfigError(
                f"{pre}message.{pol}: unknown wait policy; use one of {', '.join(POLICIES)}"
            )
        if not isinstance(m, dict):
            raise ConfigError(f"{where[:-1]}: must be a [message.{pol}] table")
        sizes = _numbers(m, "sizes", where, integer=True)
        hops = _numbers(m, "hop_seconds", where)
        if len(sizes) != len(hops):
            raise ConfigError(
                f"{where}hop_seconds: {len(hops)} values for {len(sizes)} sizes; give one each"
            )
        messages[pol] = MessageCost(
            _num(m, "alpha", where),
            _num(m, "beta", where),
            _num(m, "residual", where),
            sizes,
            hops,
            _num(m, "wakeup", where),
            _num(m, "action_overhead", where) if "action_overhead" in m else 0.0,
        )
    layers = []
    raw = data.get("layers", [])
    if not isinstance(raw, list):
        raise ConfigError(f"{pre}layers: must be an array of [[layers]] tables")
    for i, entry in enumerate(raw):
        where = f"{pre}layers[{i}]."
        if not isinstance(entry, dict):
            raise ConfigError(f"{where[:-1]}: must be a [[layers]] table")
        kind = entry.get("kind")
        if kind not in KINDS:
            raise ConfigError(f"{where}kind = {kind!r} is not allowed: one of {', '.join(KINDS)}")
        layers.append(
            LayerCost(
                kind,
                _num(entry, "width", where, integer=True, positive=True),
                _num(entry, "rows", where, integer=True, positive=True),
                _num(entry, "forward", where),
                _num(entry, "backward", where),
                _num(entry, "spread", where) if "spread" in entry else 0.0,
                _num(entry, "noise", where) if "noise" in entry else 0.0,
            )
        )
    emulated = None
    em = _table(data, "emulated", pre, required=False)
    if em is not None:
        where = f"{pre}emulated."
        emulated = Emulated(
            _num(em, "layer_time", where, positive=True),
            _num(em, "sleep", where),
            _num(em, "spread", where) if "spread" in em else 0.0,
        )
    return MachineProfile(
        dict(machine), ranks, tuple(hosts), per_host, messages, layers, emulated, path, text
    )


def read(path: str) -> MachineProfile:
    """The profile at ``path``; a missing or unreadable file is a ConfigError naming it."""
    from hpcpipe.run.config import check_path

    check_path("machine", path, write=False)
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"machine = {path!r}: no such file; write one with "
            "hpcpipe calibrate --np N --output FILE"
        )
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"machine = {path!r}: cannot be read ({e})") from None
    return parse(text, path)


# ---------------------------------------------------------------- writing
def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else "inf")
    if isinstance(v, str):  # a TOML basic string: escape \, " and control characters
        out = v.replace("\\", "\\\\").replace('"', '\\"')
        out = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in out)
        return '"' + out + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} to TOML")


def _lines(table: dict, notes: dict | None = None) -> list[str]:
    notes = notes or {}
    out = []
    for k, v in table.items():
        note = f"  # {notes[k]}" if k in notes else ""
        out.append(f"{k} = {_value(v)}{note}")
    return out


MESSAGE_NOTES = {
    "alpha": "s per message (relay of waiting ranks: includes their wake-up)",
    "beta": "s per payload byte",
    "residual": "relative RMS residual of the fit alpha + beta * bytes",
    "sizes": "payload bytes measured",
    "hop_seconds": "measured median time per hop at each size",
    "wakeup": "s: one-way latency to a rank that has waited idle under this policy",
    "action_overhead": "s per action the engine adds at this rank count (GPipe call fit)",
}


def dumps(profile: dict) -> str:
    """TOML text of a profile given as plain data (the keys of the schema), with comments."""
    out = [
        "# hpcpipe machine profile: the cost model of one machine at one rank count and",
        "# placement, in seconds. Written by `hpcpipe calibrate`; plain TOML, editable.",
        "# Use it with `hpcpipe run --machine FILE` (model clock and simulator in seconds).",
        f"schema = {SCHEMA}",
        "",
        "[machine]",
        *_lines(profile["machine"]),
        "",
        "[placement]",
        *_lines(profile["placement"]),
    ]
    for pol, m in profile["message"].items():
        out += ["", f"[message.{pol}]", *_lines(m, MESSAGE_NOTES)]
    for layer in profile.get("layers", []):
        out += [
            "",
            "[[layers]]",
            *_lines(
                layer,
                {
                    "forward": "s per forward of one item through one block",
                    "backward": "s per backward of one item through one block",
                    "spread": "relative interquartile range of the repeats",
                    "noise": "s to draw one item's Gaussian smoothing noise (rows x width)",
                },
            ),
        ]
    if profile.get("emulated"):
        out += [
            "",
            "[emulated]",
            *_lines(
                profile["emulated"],
                {
                    "layer_time": "s, as set (--layer-time)",
                    "sleep": "s, measured duration of one emulated action",
                },
            ),
        ]
    return "\n".join(out) + "\n"
