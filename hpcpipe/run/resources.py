"""Memory a run needs, estimated from its settings before anything is allocated.

The estimate is a sum of the parts that grow with the settings (bytes, float64):

* layers: Δ blocks of n×n weights, n = d for the chains, the MLP width otherwise,
  each held by the training and the evaluation engine with its factor / gradient
  copies — 20·n² bytes per block (measured: 5 KB per d = 16 block, both engines);
  with ``layers = "householder"`` (the chains' O(d) blocks) a block is r = 2
  vectors of d, held by both engines: 2·8·r·d bytes per block;
* a built-in chain on the simulated executor is never built layer by layer: it is
  composed once per process (``pipeline.simulated``), dense layers into one d×d
  matrix (with the LAPACK factor and workspace: 4·8·d², plus the kept power-of-two
  prefixes, at most 256 MiB), Householder layers into one stack of r·Δ vectors
  (``model.reflectors``: 8·r·Δ·(d + 64) bytes with the panels' T);
* activations: K samples × M work items × Δ layers × n values, stashed for the
  backward pass (inputs, outputs, gradients: 4 copies); a composed chain keeps no
  per-layer values: K·M·n values, 4 copies;
* the iteration table kept in memory: T rows of Python tuples (≈ 500 bytes each),
  when no time budget ends the run earlier;
* the recorded timeline: (all of the first ``timeline_limit`` iterations, then every
  ``timeline_every``-th) × 2·K·M actions per stage × S stages × 8 float64 fields;
* a fixed 100 MB per rank (interpreter, numpy, MPI).

The limit is the memory the machine has available (``MemAvailable`` in
/proc/meminfo, else physical memory), or ``HPCPIPE_MEMORY_LIMIT`` (bytes, or with
a suffix K, M, G, T meaning KiB..TiB) on a cluster whose compute nodes differ from
the node that checks the configuration.
"""

from __future__ import annotations

import os
import re

GiB = 1 << 30
LIMIT_ENV = "HPCPIPE_MEMORY_LIMIT"
MLP_PROBLEMS = ("attack", "attack-targeted", "fewshot")  # width x width blocks; chains' d x d
REFLECTORS = 2  # layers.REFLECTORS (not imported: this module loads no numpy)
PREFIX_BYTES = 256 * 2**20  # pipeline.simulated.PREFIX_BYTES


def limit_bytes() -> tuple[int, str]:
    """(limit, where it comes from)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if text:
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
        if not m:
            raise ValueError(f"{LIMIT_ENV}={text!r}: write bytes or e.g. 16G")
        scale = 1024 ** "_KMGT".index(m.group(2).upper() or "_")
        return int(float(m.group(1)) * scale), LIMIT_ENV
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available memory (MemAvailable)"
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    except (ValueError, OSError, AttributeError):
        return 1 << 62, "unknown"


def estimate(cfg, n_ranks: int | None = None) -> dict[str, tuple[int, str]]:
    """{part: (bytes, the settings it grows with)} for a run of ``cfg`` on n_ranks."""
    ranks = n_ranks or 1
    mlp = cfg.problem in MLP_PROBLEMS
    n, name = (cfg.width, "width") if mlp else (cfg.dim, "dim")
    items = cfg.samples * max(cfg.microbatches or cfg.m, 1)
    householder = not mlp and cfg.layers == "householder"
    kind = ", layers = householder" if householder else ""
    # a built-in chain on the simulated executor is composed, not built layer by layer
    fused = not mlp and ":" not in cfg.problem and cfg.executor in ("simulated", "reduced")
    if fused and householder:
        layer_bytes = 8 * REFLECTORS * cfg.depth * (n + 64)
    elif fused:
        layer_bytes = 4 * 8 * n * n + min(PREFIX_BYTES, 8 * n * n * cfg.depth.bit_length())
    elif householder:
        layer_bytes = 2 * 8 * REFLECTORS * n * cfg.depth
    else:
        layer_bytes = 20 * cfg.depth * n * n
    parts = {
        "layers": (layer_bytes, f"depth = {cfg.depth}, {name} = {n}{kind}"),
        "activations": (
            4 * 8 * items * (1 if fused else cfg.depth) * n,
            f"samples = {cfg.samples}, m = {cfg.m}, depth = {cfg.depth}, {name} = {n}",
        ),
        "ranks": (100 * 2**20 * ranks, f"{ranks} ranks"),
    }
    if not cfg.time_budget and cfg.mode != "theory":
        parts["iteration table"] = (500 * cfg.iterations, f"iterations = {cfg.iterations}")
        limit, every = cfg.timeline_limit, max(cfg.timeline_every, 1)
        recorded = min(cfg.iterations, limit) + max(cfg.iterations - limit, 0) // every
        parts["timeline"] = (
            recorded * 2 * items * ranks * 8 * 8,
            f"samples = {cfg.samples}, m = {cfg.m}, iterations = {cfg.iterations}, "
            f"timeline_limit = {limit}, timeline_every = {every}",
        )
    return parts


def _gib(b: int) -> str:
    return f"{b / GiB:.3g} GiB"


def memory_error(cfg, n_ranks: int | None = None) -> str | None:
    """Why the run cannot fit in memory (naming the settings and both figures), or None."""
    parts = estimate(cfg, n_ranks)
    total = sum(b for b, _ in parts.values())
    try:
        limit, source = limit_bytes()
    except ValueError as e:
        return str(e)
    if total <= limit:
        return None
    big, (b, why) = max(parts.items(), key=lambda kv: kv[1][0])
    dense_chain = big == "layers" and cfg.problem not in MLP_PROBLEMS and cfg.layers == "dense"
    return (
        f"{why}: the run needs about {_gib(total)} of memory ({big}: {_gib(b)}), "
        f"more than the {_gib(limit)} of {source}; make it smaller"
        + (" or set layers = householder (O(d) per layer)" if dense_chain else "")
        + ("" if source == LIMIT_ENV else f" (or set {LIMIT_ENV} for the compute nodes)")
    )
