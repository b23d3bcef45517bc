"""The MPI engine equals the single-process reference (<= 1e-12 relative)."""

import numpy as np
import pytest
from helpers import from_root, sub_comm
from mpi4py import MPI

from hpcpipe.model.reference import Reference
from hpcpipe.model.stages import ModelSpec, random_batch, stage_offsets
from hpcpipe.pipeline.engine import Engine

SAMPLES, MICRO, M = 4, 2, 6  # n = 8 items, m = 6 examples, 3 per item
SPECS = {
    "mlp": ModelSpec("mlp", depth=8, d_in=5, d_out=4, width=7, head="cross_entropy", seed=11),
    "orthogonal": ModelSpec("orthogonal", depth=8, d_in=6, d_out=6, head="abs", seed=12),
}


def local_part(spec, variable, point, comm):
    if variable == "input":
        return point.copy() if comm.rank == 0 else np.zeros(0)
    offs = stage_offsets(spec, comm.size)
    return point[offs[comm.rank] : offs[comm.rank + 1]].copy()


def run_engine(
    comm, spec, batch, variable, schedule, point, gamma, call, reduce="mean", wait="sleep"
):
    eng = Engine(
        comm,
        spec,
        batch,
        variable,
        schedule,
        samples=SAMPLES,
        microbatches=MICRO,
        seed=5,
        wait=wait,
    )
    try:
        res = eng.evaluate(local_part(spec, variable, point, comm), gamma, call, reduce)
    finally:
        eng.close()
    parts = comm.allgather(res.grad)
    return res.losses, np.concatenate(parts)


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("schedule", ["sequential", "gpipe", "1f1b"])
@pytest.mark.parametrize(
    ("model", "variable"), [("mlp", "input"), ("mlp", "weights"), ("orthogonal", "input")]
)
def test_engine_equals_reference(P, schedule, variable, model):
    """The orthogonal chain has no trainable weights, so only its input is a variable."""
    spec = SPECS[model]
    batch = random_batch(spec, M, seed=3)
    ref = Reference(spec, batch, variable, seed=5)
    point = ref.initial_point() + 0.1 * np.random.default_rng(1).standard_normal(ref.size)
    gamma, call = 0.05, 7
    ref_losses, ref_grad = ref.loss_and_grad(point, gamma, call, SAMPLES)
    err = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            losses, grad = run_engine(comm, spec, batch, variable, schedule, point, gamma, call)
            err = (rel(losses, ref_losses), rel(grad, ref_grad), np.abs(ref_grad).max())
    err_l, err_g, gmax = from_root(err)
    assert gmax > 0  # the gradient is not trivially zero
    assert err_l <= 1e-12, f"losses differ by {err_l:.3e}"
    assert err_g <= 1e-12, f"gradients differ by {err_g:.3e}"


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("P", [1, 2])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(
    ("model", "variable"), [("mlp", "input"), ("mlp", "weights"), ("orthogonal", "input")]
)
def test_engine_without_smoothing_busy_wait_equals_reference(P, schedule, variable, model):
    """γ = 0 with busy waits: the engine's direct path (every sample at the base
    parameters, MPI waits called directly) equals the reference too."""
    spec = SPECS[model]
    batch = random_batch(spec, M, seed=6)
    ref = Reference(spec, batch, variable, seed=5)
    point = ref.initial_point() + 0.1 * np.random.default_rng(7).standard_normal(ref.size)
    ref_losses, ref_grad = ref.loss_and_grad(point, 0.0, 2, SAMPLES)
    err = None
    with sub_comm(P) as comm:
        if comm != MPI.COMM_NULL:
            losses, grad = run_engine(
                comm, spec, batch, variable, schedule, point, 0.0, 2, wait="busy"
            )
            err = (rel(losses, ref_losses), rel(grad, ref_grad), np.abs(ref_grad).max())
    err_l, err_g, gmax = from_root(err)
    assert gmax > 0
    assert err_l <= 1e-12, f"losses differ by {err_l:.3e}"
    assert err_g <= 1e-12, f"gradients differ by {err_g:.3e}"


@pytest.mark.mpi(min_size=4)
def test_wall_clock_events_are_ordered_and_chained():
    """Each action waits from the end of the previous one (the first from the start of
    the call), then computes: wait <= ready <= end; the call's time runs from the start
    of stage 0's rank to the last end over the ranks, exactly (``Engine._finish``: a rank
    that enters the call before stage 0's only waits, so its own span may be longer);
    the same point passed again (its views reused) gives the same numbers."""
    spec = SPECS["mlp"]
    batch = random_batch(spec, M, seed=8)
    got = None
    with sub_comm(2) as comm:
        if comm != MPI.COMM_NULL:
            eng = Engine(comm, spec, batch, "weights", "1f1b", samples=2, microbatches=3)
            point = eng.initial_point()
            a = eng.evaluate(point)
            ev = eng.events.copy()
            point *= 1.5  # in place: the next call must see the new values
            b = eng.evaluate(point)
            c = eng.evaluate(point.copy())
            eng.close()
            same = bool(np.array_equal(b.grad, c.grad) and np.array_equal(b.losses, c.losses))
            moved = not np.array_equal(a.grad, b.grad)
            got = comm.gather((ev, a.time, same, moved), root=0)
    got = from_root(got)
    start = got[0][0][0, 0]  # stage 0 is on rank 0
    last_end = max(ev[-1, 2] for ev, *_ in got)
    for ev, t, same, moved in got:
        assert ev.shape == (2 * 2 * 3, 3)
        assert np.all(ev[:, 0] <= ev[:, 1]) and np.all(ev[:, 1] <= ev[:, 2])
        np.testing.assert_array_equal(ev[1:, 0], ev[:-1, 2])
        assert t == last_end - start
        assert same and moved


@pytest.mark.mpi(min_size=4)
def test_orthogonal_chain_has_no_weights():
    assert Reference(SPECS["orthogonal"], random_batch(SPECS["orthogonal"], 2), "weights").size == 0


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("variable", ["input", "weights"])
def test_depth8_on_4_ranks_equals_1_rank(variable):
    """Δ = 8 split 2 layers per rank on P = 4 gives the numbers of P = 1."""
    spec = SPECS["mlp"]
    batch = random_batch(spec, M, seed=4)
    ref = Reference(spec, batch, variable, seed=5)
    point = ref.initial_point() + 0.05 * np.random.default_rng(2).standard_normal(ref.size)
    out = {}
    for P in (1, 4):
        with sub_comm(P) as comm:
            if comm != MPI.COMM_NULL:
                out[P] = run_engine(comm, spec, batch, variable, "1f1b", point, 0.1, 3, "sum")
    l1, g1 = from_root(out.get(1))
    l4, g4 = from_root(out.get(4))
    assert rel(l4, l1) <= 1e-12
    assert rel(g4, g1) <= 1e-12
    assert np.abs(g1).max() > 0


@pytest.mark.mpi(min_size=4)
def test_perturbation_changes_the_numbers():
    """γ > 0 really perturbs: the K samples give K different losses."""
    spec = SPECS["mlp"]
    batch = random_batch(spec, M, seed=4)
    with sub_comm(4) as comm:
        res = None
        if comm != MPI.COMM_NULL:
            losses, _ = run_engine(
                comm, spec, batch, "input", "gpipe", np.zeros(batch.m * spec.d_in), 0.5, 1
            )
            res = losses
    losses = from_root(res)
    assert len(set(np.round(losses, 12))) == SAMPLES


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_busy_and_sleep_waits_give_bitwise_the_same_call(schedule):
    """The wait policy changes how a rank waits, never what it computes: busy and sleep
    waits give bitwise the same gradient, losses and stash peak, and the peak is the one
    ``schedules.peak_stash`` predicts."""
    from hpcpipe.pipeline import schedules

    spec = SPECS["mlp"]
    batch = random_batch(spec, M, seed=9)
    got = None
    with sub_comm(2) as comm:
        if comm != MPI.COMM_NULL:
            out = {}
            for wait in ("busy", "sleep"):
                eng = Engine(
                    comm, spec, batch, "weights", schedule, samples=SAMPLES,
                    microbatches=MICRO, seed=5, wait=wait,
                )  # fmt: skip
                point = eng.initial_point() * 1.1
                res = eng.evaluate(point, 0.0, 3, reduce="sum")
                out[wait] = (res.grad, res.losses, eng.peak_stash)
                n_actions = eng.events.shape[0]
                sch = eng.schedule
                eng.close()
            predicted = schedules.peak_stash(sch)[comm.rank]
            got = comm.gather((out, n_actions, len(sch.order[comm.rank]), predicted), root=0)
    got = from_root(got)
    for out, n_actions, n_listed, predicted in got:
        g_busy, l_busy, peak_busy = out["busy"]
        g_sleep, l_sleep, peak_sleep = out["sleep"]
        np.testing.assert_array_equal(g_busy, g_sleep)
        np.testing.assert_array_equal(l_busy, l_sleep)
        assert peak_busy == peak_sleep == predicted
        assert n_actions == n_listed
        assert np.abs(g_busy).max() > 0
