"""Every built-in schedule on the MPI engine, several stages per rank included.

On 1, 2 and 4 ranks, for every registered schedule (interleaved-1f1b,
looped-bfs and zb-v place 2 stages on each rank), with messages costing
α + bytes·β and t_B split into t_I + t_W:

* the model-clock pipeline time and every action's end equal the
  simulator's bit for bit (a same-rank hand-off costs no message: it would
  add α + bytes·β if it were one, and the times would differ);
* the gradient, through the weights and through the input, with K = 2
  perturbed samples and M = 2 microbatches, equals the simulated executor's
  (one process, no schedule) to <= 1e-12;
* the rank's measured peak of stashed items equals ``schedules.peak_stash``.

A run through the run loop (max-chain, PPRS) on the engine equals the
simulated executor (iterates <= 1e-12, pipeline time bitwise), and its
trace draws every action on its rank's track, with a flow per inter-rank
message and none for a same-rank hand-off.
"""

import json

import numpy as np
import pytest
from helpers import from_root, sub_comm
from mpi4py import MPI

from hpcpipe.errors import ConfigError
from hpcpipe.model.stages import ModelSpec, random_batch, stage_offsets
from hpcpipe.pipeline import schedules
from hpcpipe.pipeline.clocks import CostModel
from hpcpipe.pipeline.engine import Engine
from hpcpipe.pipeline.executors import mpi_engine
from hpcpipe.pipeline.schedules import SCHEDULES, build
from hpcpipe.pipeline.simulated import SimulatedPipeline
from hpcpipe.pipeline.simulator import message_costs, simulate, stage_times
from hpcpipe.run.config import make_config
from hpcpipe.run.runner import gather_theta, make_problem, run

DEPTH, D, ROWS, K, M = 8, 4, 2, 2, 2
N = K * M
COSTS = CostModel.uniform(DEPTH, 1e-3, 3e-3, alpha=5e-5, beta=1e-8, weight_share=0.25)
SPEC = ModelSpec("mlp", depth=DEPTH, d_in=D, d_out=D, width=D, head="squared", seed=1)
PLACED = [s for s in SCHEDULES.names() if not build(s, 2, 2).one_stage_per_rank]


def _reference(name, P, variable, gamma, call):
    batch = random_batch(SPEC, ROWS * M, seed=2)
    sch = build(name, P, N)
    sim = SimulatedPipeline(
        SPEC, batch, variable, sch, samples=K, microbatches=M, seed=5, costs=COSTS, stages=P,
        fused="off",
    )  # fmt: skip
    res = sim.evaluate(sim.initial_point(), gamma, call)
    S = sch.n_stages
    tf, tb = stage_times(COSTS, DEPTH, S)
    ti = [COSTS.split(t)[0] for t in tb]
    tw = [COSTS.split(t)[1] for t in tb]
    msg = message_costs(COSTS, [D] * (S - 1), [ROWS] * N)
    timing = simulate(sch, tf, tb, msg, t_input=ti, t_weight=tw)
    return res, timing, sch, batch


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("name", list(SCHEDULES.names()))
@pytest.mark.parametrize("variable", ["weights", "input"])
def test_engine_equals_simulator_and_simulated_executor(variable, name, P):
    gamma, call = 0.05, 1
    ref, timing, sch, batch = _reference(name, P, variable, gamma, call)
    got = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            eng = Engine(
                comm, SPEC, batch, variable, name, samples=K, microbatches=M, seed=5,
                clock="model", costs=COSTS, wait="sleep",
            )  # fmt: skip
            res = eng.evaluate(eng.initial_point(), gamma, call)
            parts = comm.gather((eng.local_stages, res.grad), root=0)
            ends = comm.gather(eng.events[:, 2].copy(), root=0)
            peaks = comm.gather(eng.peak_stash, root=0)
            losses = res.losses.copy()
            eng.close()
            got = (res.time, ends, parts, peaks, losses)
    t_mpi, ends, parts, peaks, losses = from_root(got)
    assert t_mpi == timing.makespan  # bitwise
    assert t_mpi == ref.time
    for r in range(P):
        np.testing.assert_array_equal(ends[r], timing.ends[r])
    assert peaks == schedules.peak_stash(sch)
    np.testing.assert_allclose(losses, ref.losses, rtol=0, atol=1e-12)
    if variable == "input":
        grad = parts[0][1]  # rank 0 holds stage 0 in every built-in placement
    else:
        offs = stage_offsets(SPEC, sch.n_stages)
        grad = np.empty(offs[-1])
        for local, g in parts:
            at = 0
            for s in local:
                size = offs[s + 1] - offs[s]
                grad[offs[s] : offs[s + 1]] = g[at : at + size]
                at += size
            assert at == g.size
    np.testing.assert_allclose(grad, ref.grad, rtol=0, atol=1e-12)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [2, 4])
def test_split_backward_gradient_equals_full_backward(P):
    """zb-v's I and W (deferred) give the gradient of interleaved 1F1B's B to 1e-12."""
    batch = random_batch(SPEC, ROWS * M, seed=2)
    got = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            out = {}
            for name in ("zb-v", "looped-bfs"):  # V and looped placements: same 2P stages
                eng = Engine(
                    comm, SPEC, batch, "weights", name, samples=K, microbatches=M, seed=5,
                    clock="none", wait="sleep",
                )  # fmt: skip
                res = eng.evaluate(eng.initial_point(), 0.05, 2)
                per_stage = dict(zip(eng.local_stages, _split(res.grad, eng)))
                eng.close()
                out[name] = comm.gather(per_stage, root=0)
            got = out
    out = from_root(got)
    merged = {name: {s: g for d in out[name] for s, g in d.items()} for name in out}
    assert set(merged["zb-v"]) == set(merged["looped-bfs"]) == set(range(2 * P))
    for s in range(2 * P):
        np.testing.assert_allclose(merged["zb-v"][s], merged["looped-bfs"][s], rtol=0, atol=1e-12)


def _split(vec, eng):
    offs = eng._param_offs
    return [vec[offs[u] : offs[u + 1]] for u in range(len(eng.stages))]


@pytest.mark.mpi(min_size=2)
def test_weights_variable_with_several_stages_per_rank_is_refused_on_a_run():
    batch = random_batch(SPEC, ROWS * M, seed=2)
    err = None
    with sub_comm(2) as comm:
        if comm != MPI.COMM_NULL:
            try:
                mpi_engine(
                    comm, SPEC, batch, variable="weights", schedule="zb-v", samples=K,
                    microbatches=M, clock="none", wait="sleep",
                )  # fmt: skip
            except ConfigError as e:
                err = str(e)
    err = from_root(err)
    assert err is not None and "schedule = 'zb-v'" in err and "executor = 'simulated'" in err


RUN = dict(
    problem="max-chain", depth=DEPTH, dim=4, optimizer="pprs", samples=4, gamma=0.05, lr=0.05,
    iterations=3, progress="off", seed=3, eval_every=0, t_forward=1e-3, t_backward=2e-3,
    alpha=5e-5, beta=1e-8,
)  # fmt: skip


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("schedule", PLACED)
def test_run_loop_equals_simulated_and_trace_draws_messages(schedule, P, tmp_path_factory):
    out = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            path = None
            if comm.rank == 0:
                path = str(tmp_path_factory.mktemp("placed") / "run.h5")
            path = comm.bcast(path, root=0)
            cfg = make_config({**RUN, "schedule": schedule, "executor": "mpi", "output": path})
            res = run(cfg, comm)
            theta = gather_theta(res, comm, make_problem(cfg, MPI.COMM_SELF))
            out = (theta, res.column("pipeline_time"), path)
    theta_mpi, time_mpi, path = from_root(out)
    sim_cfg = make_config({**RUN, "schedule": schedule, "executor": "simulated", "stages": P})
    sim = run(sim_cfg, MPI.COMM_SELF)
    np.testing.assert_allclose(sim.theta, theta_mpi, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(sim.column("pipeline_time"), time_mpi)  # bitwise
    if MPI.COMM_WORLD.rank == 0:
        _check_trace(path, schedule, P)


def _check_trace(path, schedule, P):
    from hpcpipe.run.results import load
    from hpcpipe.run.trace import write_trace

    r = load(path)
    it = int(np.asarray(r.timeline["iteration"]).min())
    dest = path.replace(".h5", ".json")
    write_trace(r.timeline, dest, "model", [it], r.iterations, 0)
    events = json.loads(open(dest).read())["traceEvents"]
    sch = build(schedule, P, RUN["samples"])
    slices = [e for e in events if e["ph"] == "X" and e.get("cat") in ("F", "B", "I", "W")]
    got = sorted((e["pid"], e["tid"], e["name"]) for e in slices)
    want = sorted(
        (sch.placement[a.stage], a.stage, f"{a.kind}{a.item}")
        for acts in sch.rank_actions
        for a in acts
    )
    assert got == want  # every action once, on its rank's track (tid = its stage)
    # the messages: F to the next stage, B / I to the previous; local when on one rank
    hops = [
        sch.placement[c] != sch.placement[a.stage]
        for acts in sch.actions
        for a in acts
        if (c := schedules.consumer(a.stage, schedules.Kind.parse(a.kind), sch.n_stages))
        is not None
    ]
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == sum(hops)  # one arrow per inter-rank message
    assert all(s["pid"] != f["pid"] for s, f in zip(starts, ends))  # none inside a rank
    if schedule == "zb-v":
        assert not all(hops)  # its turn at the last rank is a same-rank hand-off
