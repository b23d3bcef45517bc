"""The ``units`` attribute of every dataset of a result file.

Units are strings: ``s`` (seconds), ``tau`` (the model clock's unit: one layer's forward
or backward at t_forward = t_backward = 1), ``iterations`` (an iteration number) and
``1`` (dimensionless: losses, gaps, step sizes, counts, indices, the optimizer's
variables). A time on the run's clock is in ``tau`` with ``clock = "model"`` and no
machine profile, and in ``s`` with ``clock = "wall"`` or a machine profile (whose
model costs are seconds). A dataset whose entries differ in unit gives them in order,
comma-separated (``/state/scalars``, ``/state/stage``), as its ``about`` text names them.
"""

from __future__ import annotations

ATTR = "units"

# per dataset name in its group; CLOCK: the run's clock unit
CLOCK = "clock"
ITERATIONS = {
    "iteration": "iterations",
    "loss": "1",
    "f": "1",
    "best_f": "1",
    "gap": "1",
    "grad_norm": "1",
    "step": "1",
    "pipeline_time": CLOCK,
    "wall_time": "s",
}
TIMELINE = {
    "iteration": "iterations",
    "rank": "1",
    "stage": "1",
    "kind": "1",
    "item": "1",
    "wait": CLOCK,
    "start": CLOCK,
    "end": CLOCK,
}
STAGES = {"busy": CLOCK, "wait": CLOCK, "idle": CLOCK, "actions": "1"}
# /state (and /state/backup): scalars = [next iteration, best f, pipeline time, first loss],
# stage = per-stage [busy, wait, idle, actions]; the optimizer's arrays and scalars, commit
STATE = {
    "scalars": f"iterations, 1, {CLOCK}, 1",
    "stage": f"{CLOCK}, {CLOCK}, {CLOCK}, 1",
    "optimizer_scalars": "1",
    "commit": "1",
}


def clock_unit(attrs) -> str:
    """The unit of the run's clock from the file's root attributes."""
    if str(attrs.get("model_time_unit", "")) == "s" or str(attrs.get("clock", "")) == "wall":
        return "s"
    return "tau"


def unit_of(path: str, clock: str) -> str:
    """The unit of the dataset at ``path`` (e.g. ``iterations/gap``); ``clock``: clock_unit."""
    parts = path.strip("/").split("/")
    group, name = parts[0], parts[-1]
    if group == "iterations":
        unit = ITERATIONS.get(name, "1")
    elif group == "timeline":
        unit = TIMELINE.get(name, "1")
    elif group == "stages":
        unit = STAGES.get(name, "1")
    elif group == "state" and "optimizer" not in parts[1:-1]:
        unit = STATE.get(name, "1")
    else:  # the optimizer's arrays: the variable θ and its companions
        unit = "1"
    return unit.replace(CLOCK, clock)


def label(f) -> None:
    """Set the ``units`` attribute of every dataset of the open file ``f``."""
    import h5py

    clock = clock_unit(f.attrs)

    def visit(name, obj) -> None:
        if isinstance(obj, h5py.Dataset):
            obj.attrs[ATTR] = unit_of(name, clock)

    f.visititems(visit)
