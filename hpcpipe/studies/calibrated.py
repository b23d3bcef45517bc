"""The calibrated model's seconds for one iteration of a recorded run (its machine profile).

A run made with ``machine = PROFILE`` records the profile's text (``machine_profile``)
and its model's blocks (``problem["model"]``: kind, depth, d_in, d_out, width). From
those, one oracle call of schedule σ with n = K·M work items on S stages costs, in
seconds, the simulator's makespan of σ(S, n) under the profile's costs
(``MachineProfile.cost_model``):

* a stage's forward / backward: its blocks' measured layer times at the model's width
  (scaled by rows·n_in·n_out for blocks that are not square), plus the measured
  duration of the emulated action when the run emulates layers (``layer_time``), plus
  the engine's action overhead of the wait policy;
* the first block's forward of a run that smooths its input (γ ≠ 0, variable =
  input: PPRS on the chains) also draws the sample's Gaussian noise, charged the
  profile's measured draw (``noise`` of its ``[[layers]]``; ``input_noise``);
* a message of item i across boundary s: α + bytes·β of the run's wait policy, with
  bytes = rows_i · width_s · 8.

This is the prediction ``derived_figures`` records at the end of the run, computed
again from the recorded profile so that a study holds the measurement to the profile
it names (and an edited profile, e.g. α × 10, changes the prediction).
"""

from __future__ import annotations

from hpcpipe.errors import ConfigError


def model_fields(spec) -> dict:
    """What a result records of its model (``problem["model"]``); {} for a user's own
    model that is not a built-in ``ModelSpec``."""
    from hpcpipe.model.stages import ModelSpec

    if not isinstance(spec, ModelSpec):
        return {}
    keys = ("kind", "depth", "d_in", "d_out", "width")
    return {"model": {k: getattr(spec, k) for k in keys}}


def model_spec(r):
    """The recorded run's ``ModelSpec`` (its blocks' kind and sizes), or None when unknown.

    Results that predate ``problem["model"]`` are known for the chain problems only: an
    orthogonal chain of ``dim`` (``layers = "dense"``, the default) or Householder chain.
    """
    from hpcpipe.model.stages import ModelSpec
    from hpcpipe.problems.chains import LAYER_KINDS

    depth = int(r.config["depth"])
    got = (r.problem or {}).get("model")
    if isinstance(got, dict):
        return ModelSpec(
            str(got["kind"]),
            depth=int(got["depth"]),
            d_in=int(got["d_in"]),
            d_out=int(got["d_out"]),
            width=int(got.get("width", 0)),
        )
    name = str((r.problem or {}).get("name") or r.config.get("problem", ""))
    if "dim" in r.config and name.endswith("chain"):
        d = int(r.config["dim"])
        kind = LAYER_KINDS.get(str(r.config.get("layers", "dense")), "orthogonal")
        return ModelSpec(kind, depth=depth, d_in=d, d_out=d)
    return None


def wait_policy(r, prof) -> str:
    """The run's wait policy, ``auto`` resolved as ``transport.Waiter`` did on the
    calibrated machine: busy up to its cores, else yield."""
    policy = str(r.config.get("wait", "auto"))
    if policy == "auto":
        policy = "busy" if r.n_ranks <= int(prof.machine.get("cores", 1)) else "yield"
    return policy


def input_noise(r) -> bool:
    """Whether the recorded run smooths its input (γ ≠ 0 and θ is the input), so that
    its first stage draws the noise Z_k of each sample.

    Results that predate the recorded ``problem["variable"]`` are known for the chain
    problems (their variable is the input); other problems are taken as not drawing it.
    """
    gamma = float(r.method.get("gamma", r.config.get("gamma", 0.0)) or 0.0)
    if gamma == 0.0:
        return False
    problem = r.problem or {}
    variable = problem.get("variable")
    if variable is None:
        name = str(problem.get("name") or r.config.get("problem", ""))
        variable = "input" if name.endswith("chain") else ""
    return variable == "input"


def iteration_seconds(r, schedule: str = "") -> float:
    """The calibrated model's seconds for one oracle call of the recorded run ``r`` on
    ``schedule`` (default: the run's own), one stage per MPI rank.

    ConfigError when the run recorded no profile or no model the profile can time.
    """
    from hpcpipe.machine.profile import parse
    from hpcpipe.model.stages import microbatch_bounds, partition
    from hpcpipe.pipeline.schedules import build
    from hpcpipe.pipeline.simulator import message_costs, simulate, stage_times

    if not r.machine:
        raise ConfigError(f"{r.file}: the run recorded no machine profile (machine =)")
    spec = model_spec(r)
    if spec is None:
        raise ConfigError(
            f"{r.file}: problem.model: the run recorded no model blocks to time; "
            "rerun it with this version of hpcpipe"
        )
    prof = parse(r.machine)
    S = r.n_ranks
    m = int(r.config.get("m", 1))
    micro = int(r.config.get("microbatches", 0)) or m
    bounds = microbatch_bounds(m, micro)
    n = int(r.method.get("samples", 1)) * micro
    item_rows = [hi - lo for lo, hi in (bounds[i % micro] for i in range(n))]
    costs = prof.cost_model(
        spec,
        max(item_rows),
        wait_policy(r, prof),
        float(r.config.get("layer_time", 0.0)),
        stages=S,
        input_noise=input_noise(r),
    )
    tf, tb = stage_times(costs, spec.depth, S)
    msg = None
    if S > 1:
        dims = spec.dims()
        widths = [dims[hi] for _, hi in partition(spec.depth, S)[:-1]]
        msg = message_costs(costs, widths, item_rows)
    return simulate(build(schedule or str(r.config["schedule"]), S, n), tf, tb, msg).makespan


__all__ = ["input_noise", "iteration_seconds", "model_fields", "model_spec", "wait_policy"]
