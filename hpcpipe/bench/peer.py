"""``hpcpipe bench peer``: one GPipe training step, hpcpipe against torch.distributed.pipelining.

The same MLP (one block per process: Dense + ReLU, the last without ReLU),
the same weights, data, microbatches and float type, in the same processes:
hpcpipe over MPI (buffer API) and PyTorch's ``ScheduleGPipe`` over gloo,
one thread per process, steps interleaved so both see the same machine.
Correctness first: both must produce the same gradients (float64, 1e-10)
before any time is printed. Loss: ½‖z − t‖²/m summed over microbatches
(torch: ``scale_grads=False``), so the two gradients are the same function.

PyTorch is the optional ``peer`` extra: ``pip install torch==2.13.0`` with a
CPU build (see README).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from hpcpipe.bench.common import machine_line, write_record
from hpcpipe.model.stages import ModelSpec, random_batch
from hpcpipe.pipeline.engine import Engine
from hpcpipe.run.table import table


def _torch():
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    except ImportError:
        return None
    return torch, dist, PipelineStage, ScheduleGPipe


INSTALL = (
    "bench peer needs PyTorch (CPU build): pip install 'hpcpipe[peer]' on a machine "
    "whose pip finds the CPU wheel, or pip install torch==2.13.0 from PyTorch's CPU "
    "wheel index"
)


def peer_case(comm, width: int, mb: int, M: int, repeats: int, pg) -> dict:
    torch, dist, PipelineStage, ScheduleGPipe = _torch()
    P, r = comm.size, comm.rank
    spec = ModelSpec("mlp", depth=P, d_in=width, d_out=width, width=width, head="squared", seed=1)
    batch = random_batch(spec, M * mb, seed=2)
    eng = Engine(
        comm,
        spec,
        batch,
        "weights",
        "gpipe",
        samples=1,
        microbatches=M,
        clock="wall",
        wait="auto",
    )
    point = eng.initial_point()
    # the same block in torch, weights copied (torch Linear: y = x Wᵀ + b)
    w, b = eng.stage.views(point)[0]
    lin = torch.nn.Linear(width, width, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w.T.copy()))
        lin.bias.copy_(torch.from_numpy(b.copy()))
    mod = torch.nn.Sequential(lin, torch.nn.ReLU()) if r < P - 1 else torch.nn.Sequential(lin)
    stage = PipelineStage(mod, r, P, torch.device("cpu"), group=pg)  # shapes inferred
    m = M * mb

    def loss_fn(out, tgt):
        return 0.5 * ((out - tgt) ** 2).sum() / m

    sched = ScheduleGPipe(stage, M, loss_fn=loss_fn, scale_grads=False)
    x = torch.from_numpy(batch.x.copy())
    t = torch.from_numpy(np.asarray(batch.targets, dtype=np.float64).copy())

    def torch_step():
        mod.zero_grad(set_to_none=False)
        if r == 0 and P > 1:
            sched.step(x)
        elif r == P - 1 and P > 1:
            sched.step(target=t, losses=[])
        else:
            sched.step(x, target=t, losses=[])

    # correctness: the same gradient from both
    g_h = eng.evaluate(point).grad
    torch_step()
    g_t = np.concatenate([lin.weight.grad.numpy().T.ravel(), lin.bias.grad.numpy()])
    err = np.abs(g_h - g_t).max() / max(np.abs(g_t).max(), 1e-300)
    err = max(comm.allgather(float(err)))
    times = {"hpcpipe": [], "torch": []}
    for i in range(repeats + 1):
        for who in ("hpcpipe", "torch") if i % 2 == 0 else ("torch", "hpcpipe"):
            comm.Barrier()
            t0 = time.perf_counter()
            if who == "hpcpipe":
                eng.evaluate(point)
            else:
                torch_step()
            dt = comm.allreduce(time.perf_counter() - t0, op=__import__("mpi4py").MPI.MAX)
            if i > 0:
                times[who].append(dt)
    eng.close()
    th, tt = statistics.median(times["hpcpipe"]), statistics.median(times["torch"])
    return {
        "P": P,
        "width": width,
        "mb": mb,
        "M": M,
        "hpcpipe_ms": th * 1e3,
        "torch_ms": tt * 1e3,
        "speedup": tt / th,
        "grad_rel_err": err,
    }


def bench_peer(comm, widths, mbs, Ms, repeats: int, port: int) -> int:
    mods = _torch()
    if mods is None:
        if comm.rank == 0:
            print(INSTALL, file=sys.stderr)
        return 2
    torch, dist, _, _ = mods
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size
    )
    pg = dist.group.WORLD
    rows = []
    ok = True
    try:
        for w in widths:
            for mb in mbs:
                for M in Ms:
                    reps = repeats if w < 1024 else max(3, repeats // 4)
                    row = peer_case(comm, w, mb, M, reps, pg)
                    ok &= row["grad_rel_err"] <= 1e-10
                    rows.append(row)
    finally:
        dist.destroy_process_group()
    if comm.rank == 0:
        print("command: hpcpipe " + " ".join(sys.argv[1:]))
        print(machine_line(comm) + f", torch {torch.__version__} (gloo, 1 thread)")
        what = (
            "one GPipe training step (forward + backward of M microbatches of mb rows, "
            f"float64), median of the interleaved repeats; torch {torch.__version__} "
            "(gloo, 1 thread)"
        )
        print(what)
        keys = ["P", "width", "mb", "M", "hpcpipe_ms", "torch_ms", "speedup", "grad_rel_err"]
        head = ["P", "width", "mb", "M", "hpcpipe (ms)", "torch (ms)", "torch/hpcpipe"]
        head.append("grad rel err")
        body = [[r[k] for k in keys] for r in rows]
        print(table(head, body))
        print(
            "correctness: "
            + (
                "same gradients (<= 1e-10)"
                if ok
                else "GRADIENTS DIFFER: timings are not comparable"
            )
        )
        if write_record("peer", head, body, sane=ok, comm=comm, what=what) is False:
            return 1
    return 0 if ok else 1
