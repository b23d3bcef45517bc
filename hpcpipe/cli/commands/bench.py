"""``hpcpipe bench CASE``: benchmark cases that print figures, one sub-command per case.

Each case owns its options (``hpcpipe bench transport --help`` lists only the
transport case's). A case on MPI ranks launches itself under ``mpiexec`` with its
default rank count unless it already runs there; ``simulate`` and ``study`` run in
this process. The measuring code is in ``hpcpipe.bench.<case>``; this module
only reads the options and calls it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

from hpcpipe.cli.arguments import int_list, ranks_option
from hpcpipe.cli.launch import inside_mpi, relaunch, strip_np, under_mpi

NAME = "bench"
HELP = "benchmark cases that print figures"
DESCRIPTION = "Benchmark cases that print figures; each case has its own --help."


@dataclass(frozen=True)
class Case:
    """One benchmark case: its help line, its options and how it runs.

    ``ranks`` > 0: the case runs on ``--np`` MPI ranks (default ``ranks``), and
    ``run(args, comm)`` is called on every rank; ``ranks`` = 0: ``run(args, None)``
    runs in this process without MPI. ``ready`` says, before any launch, why the
    case cannot run (a missing package), or None.
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, object], int]
    ranks: int = 0
    ready: Callable[[], str | None] = lambda: None


DENSE_REPEATS = 31  # rounds of bench dense: three short steps each


def _repeats(parser: argparse.ArgumentParser, default: int = 5) -> None:
    parser.add_argument(
        "--repeats",
        type=int,
        default=default,
        help="repeats of each measurement (default %(default)s)",
    )


def _wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        default="auto",
        choices=["busy", "yield", "sleep", "auto"],
        help="wait policy (auto: busy when ranks <= cores, else yield)",
    )


def _step_sizes(parser: argparse.ArgumentParser) -> None:
    """The dense-chain step's sizes (cases ``dense`` and ``peer``)."""
    parser.add_argument(
        "--width", default="64", help="comma-separated widths (default %(default)s)"
    )
    parser.add_argument(
        "--mb", default="8", help="comma-separated rows per microbatch (default %(default)s)"
    )
    parser.add_argument(
        "--micro", default="16", help="comma-separated microbatches M (default %(default)s)"
    )


def _pipeline_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--depth", default="", help="comma-separated depths (>= ranks; default ranks)"
    )
    parser.add_argument("--samples", default="16", help="comma-separated K (default %(default)s)")
    parser.add_argument(
        "--layer-time", type=float, default=0.01, help="seconds per layer (default %(default)s)"
    )
    parser.add_argument(
        "--schedules", default="gpipe,1f1b", help="comma-separated schedules (default %(default)s)"
    )
    _repeats(parser)
    parser.add_argument("--spin", action="store_true", help="spin instead of sleep")
    _wait(parser)
    parser.add_argument(
        "--machine",
        default="",
        help="machine profile (hpcpipe calibrate at these ranks and this layer time): the model "
        "charges its measured action and message costs, in seconds",
    )


def _pipeline(args: argparse.Namespace, comm) -> int:
    from hpcpipe.bench.pipeline import bench_pipeline, read_machine
    from hpcpipe.errors import ConfigError

    try:
        machine = read_machine(args.machine, comm.size, args.wait, args.layer_time, args.spin)
    except ConfigError as e:  # every rank reads the same file: all return here
        if comm.rank == 0:
            print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    return bench_pipeline(
        comm,
        int_list(args.depth),
        int_list(args.samples),
        args.layer_time,
        args.schedules.split(","),
        args.repeats,
        args.spin,
        args.wait,
        machine,
    )


def _dense_options(parser: argparse.ArgumentParser) -> None:
    _step_sizes(parser)
    # a round of the default cell takes about 2 ms; with 5 rounds one preempted round on a
    # shared machine moved the median ratio a lot (four runs under load: 1.04 to 5.4)
    _repeats(parser, DENSE_REPEATS)


def _dense(args: argparse.Namespace, comm) -> int:
    from hpcpipe.bench.dense import bench_dense

    return bench_dense(
        comm, int_list(args.width), int_list(args.mb), int_list(args.micro), args.repeats
    )


def _transport_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=4 << 20,
        help="largest message, bytes (default %(default)s)",
    )
    parser.add_argument(
        "--min-bytes", type=int, default=8, help="smallest message, bytes (default %(default)s)"
    )
    parser.add_argument(
        "--iters", type=int, default=1000, help="round trips per block (default %(default)s)"
    )
    _wait(parser)
    _repeats(parser)


def _transport(args: argparse.Namespace, comm) -> int:
    from hpcpipe.bench.transport import bench_transport

    return bench_transport(
        comm, args.max_bytes, args.iters, args.wait, args.repeats, args.min_bytes
    )


def _simulate(args: argparse.Namespace, comm) -> int:
    from hpcpipe.bench.simulate import bench_simulate

    return bench_simulate(args.repeats)


def _study_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--depth",
        default="64,512,4096",
        help="comma-separated depths = stages (default %(default)s)",
    )
    parser.add_argument(
        "--samples",
        default="16",
        help="K (the first of a comma-separated list; default %(default)s)",
    )
    _repeats(parser)


def _study(args: argparse.Namespace, comm) -> int:
    from hpcpipe.bench.study import bench_study

    depths = int_list(args.depth or "64,512,4096")
    K = int(args.samples.split(",")[0])
    return bench_study(depths, 16, K, args.repeats, householder=(4096, 4096))


def _peer_options(parser: argparse.ArgumentParser) -> None:
    _step_sizes(parser)
    _repeats(parser)
    parser.add_argument(
        "--port", type=int, default=29517, help="gloo rendezvous port (default %(default)s)"
    )


def _peer(args: argparse.Namespace, comm) -> int:
    from hpcpipe.bench.peer import bench_peer

    return bench_peer(
        comm,
        int_list(args.width),
        int_list(args.mb),
        int_list(args.micro),
        args.repeats,
        args.port,
    )


def _torch_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        from hpcpipe.bench.peer import INSTALL

        return INSTALL
    return None


CASES: dict[str, Case] = {
    "pipeline": Case(
        "wall-clock oracle calls with emulated layers against the model",
        _pipeline_options,
        _pipeline,
        ranks=4,
    ),
    "dense": Case(
        "a GPipe training step of dense layers against a bare loop",
        _dense_options,
        _dense,
        ranks=2,
    ),
    "transport": Case(
        "channel latency and bandwidth against raw mpi4py paths",
        _transport_options,
        _transport,
        ranks=2,
    ),
    "simulate": Case("simulator throughput (no MPI)", _repeats, _simulate),
    "study": Case("one oracle call of the simulated pipeline (no MPI)", _study_options, _study),
    "peer": Case(
        "a GPipe step against torch.distributed.pipelining (needs torch)",
        _peer_options,
        _peer,
        ranks=2,
        ready=_torch_missing,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cases = parser.add_subparsers(dest="case", required=True, metavar="CASE")
    for name, case in CASES.items():
        p = cases.add_parser(name, help=case.help, description=case.help)
        if case.ranks:
            p.add_argument(
                "--np", type=ranks_option, default=case.ranks, help=f"ranks (default {case.ranks})"
            )
        case.add_arguments(p)


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    case = CASES[args.case]
    if not case.ranks:
        return case.run(args, None)
    if not inside_mpi():
        missing = case.ready()
        if missing:
            print(f"hpcpipe: {missing}", file=sys.stderr)
            return 2
        return relaunch(args.np, strip_np(argv))
    return under_mpi(lambda comm: case.run(args, comm))
