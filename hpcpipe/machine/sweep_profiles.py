"""The machine profiles a sweep names, and what each must be calibrated for.

A profile holds the costs of one rank count and placement (α of a relay whose
waiting ranks are descheduled grows with the ranks per core), so a sweep over
depths with one layer per rank names one profile per depth (``machine =``
in each case). ``hpcpipe calibrate --sweep FILE`` reads the sweep file,
expands its points (cases × grid, as ``hpcpipe sweep`` does, but without
reading the profiles, which may not exist yet) and, for every profile path,
calibrates what its points need:

* the rank count: the point's ranks ([sweep] ranks, or its depth);
* the wait policy: the point's ``wait`` resolved at that rank count (``auto``
  is ``busy`` up to the cores, else ``yield``, as ``transport.Waiter``);
* the layer width: the point's ``width``, else its ``dim``;
* the emulated ``layer_time`` (0: none).

Points that name the same profile with other needs are refused (one line naming
the profile and the field), before any work.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from hpcpipe.errors import ConfigError


@dataclass
class Need:
    """What one profile must be calibrated for."""

    path: str
    ranks: int
    policies: set[str] = field(default_factory=set)
    widths: set[int] = field(default_factory=set)
    layer_time: float = 0.0

    def argv(self, extra: list[str]) -> list[str]:
        """``hpcpipe calibrate`` arguments that write this profile."""
        args = ["calibrate", "--np", str(self.ranks), "--output", self.path]
        args += ["--wait", ",".join(sorted(self.policies))]
        args += ["--width", ",".join(map(str, sorted(self.widths)))]
        if self.layer_time > 0:
            args += ["--layer-time", repr(self.layer_time)]
        return args + extra


def _points(data: dict) -> list[dict]:
    base = data.get("base", {})
    grid = data.get("grid", {})
    cases = data.get("cases", [{}])
    if not isinstance(base, dict) or not isinstance(grid, dict) or not isinstance(cases, list):
        raise ConfigError("sweep file: [base], [grid] must be tables and cases [[cases]] tables")
    keys = list(grid)
    out = []
    for case in cases:
        if not isinstance(case, dict):
            raise ConfigError("sweep file: cases must be [[cases]] tables")
        for combo in itertools.product(*(grid[k] for k in keys)):
            out.append({**base, **case, **dict(zip(keys, combo))})
    return out


def needs(sweep_file: str) -> list[Need]:
    """The profiles the points of ``sweep_file`` name, each with what it must hold;
    ConfigError when no point names one."""
    found = named(sweep_file)
    if not found:
        raise ConfigError(f"--sweep {sweep_file}: no point names a machine profile (machine =)")
    return found


def named(sweep_file: str) -> list[Need]:
    """The profiles the points of ``sweep_file`` name ([] if none), each with what it must
    hold; ConfigError for a profile named by points of two rank counts or layer times."""
    from hpcpipe.pipeline.transport import Waiter
    from hpcpipe.run.config import tomllib

    p = Path(sweep_file)
    if not p.is_file():
        raise ConfigError(f"--sweep {sweep_file}: no such file")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"--sweep {sweep_file}: not valid TOML: {e}") from None
    ranks_key = data.get("sweep", {}).get("ranks", 1)
    found: dict[str, Need] = {}
    for v in _points(data):
        path = v.get("machine", "")
        if not path:
            continue
        if not isinstance(path, str):
            raise ConfigError(f"sweep {sweep_file}: machine = {path!r} must be a file path")
        depth = v.get("depth", 1)
        ranks = int(depth) if ranks_key == "depth" else int(ranks_key)
        width = int(v.get("width") or v.get("dim") or 16)
        layer_time = float(v.get("layer_time", 0.0))
        policy = Waiter(str(v.get("wait", "auto")), ranks).policy
        need = found.setdefault(path, Need(path, ranks, layer_time=layer_time))
        for name, have, want in (
            ("ranks", need.ranks, ranks),
            ("layer_time", need.layer_time, layer_time),
        ):
            if have != want:
                raise ConfigError(
                    f"sweep {sweep_file}: machine = {path!r} is named by points with "
                    f"{name} {have} and {want}: a profile holds one; name one profile per {name}"
                )
        need.policies.add(policy)
        need.widths.add(width)
    return list(found.values())


__all__ = ["Need", "named", "needs"]
