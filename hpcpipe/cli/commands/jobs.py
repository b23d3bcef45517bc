"""``hpcpipe jobs generate``: Slurm batch scripts for a sweep."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "jobs"
HELP = "Slurm batch scripts for a sweep"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["generate"])
    parser.add_argument("sweep", help="sweep file (TOML)")
    parser.add_argument("--out", required=True, help="folder for the scripts, results and report")
    parser.add_argument("--partition", default="")
    parser.add_argument("--account", default="")
    parser.add_argument("--time", default="01:00:00", help="time limit per task (HH:MM:SS)")
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--ntasks-per-node", type=int, default=0)
    parser.add_argument("--launcher", choices=["srun", "mpiexec"], default="srun")
    parser.add_argument("--mpi", default="pmi2", help="srun --mpi plugin (mpich wheel: pmi2)")
    parser.add_argument("--python", default="python3", help="the Python that has hpcpipe")
    parser.add_argument("--activate", default="", help="virtual environment to activate in jobs")
    parser.add_argument("--overcommit", action="store_true", help="allow more tasks than cores")
    share = parser.add_mutually_exclusive_group()
    share.add_argument(
        "--exclusive", dest="sharing", action="store_const", const="exclusive", default="",
        help="whole nodes for each job",
    )  # fmt: skip
    share.add_argument(
        "--shared", dest="sharing", action="store_const", const="shared",
        help="nodes shared with other jobs (--oversubscribe)",
    )  # fmt: skip
    parser.add_argument(
        "--module", action="append", default=[], help="`module load` this in jobs (repeatable)"
    )
    parser.add_argument(
        "--signal", type=int, default=0,
        help="SIGTERM the ranks this many seconds before the time limit (0: none)",
    )  # fmt: skip


def run(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    from hpcpipe.errors import ConfigError
    from hpcpipe.studies.jobs import JobOptions, generate

    opts = JobOptions(
        partition=args.partition,
        account=args.account,
        time=args.time,
        nodes=args.nodes,
        tasks_per_node=args.ntasks_per_node,
        launcher=args.launcher,
        mpi=args.mpi,
        python=args.python,
        activate=args.activate,
        overcommit=args.overcommit,
        sharing=args.sharing,
        modules=tuple(args.module),
        signal=args.signal,
    )
    from hpcpipe.run.config import path_error

    err = path_error("--out", args.out, write=True)
    if err:
        print(f"hpcpipe: {err}", file=sys.stderr)
        return 2
    try:
        files = generate(args.sweep, args.out, opts)
    except (ConfigError, ValueError) as e:
        print(f"hpcpipe: {e}", file=sys.stderr)
        return 2
    for f in files:
        print(f"wrote {f}")
    print(f"submit with: {Path(args.out) / 'submit.sh'}")
    return 0
