"""``mmp run``: torchrun with the layer active in every rank.

Takes torchrun's own options (``--nproc-per-node``, ``--nnodes``, ``--rdzv-*``, ``--master-*``,
``--node-rank`` ...), parsed by torchrun's parser, so multi-node launches work unchanged.

When a rank dies, torchrun stops the others; a rank that hangs ends itself within
``--hang-timeout`` (the ``reliability.hang_watchdog`` feature). With ``--max-restarts N`` torchrun then
restarts the group, which resumes from the latest checkpoint when the script has ``--load``.
The launcher's side of the job -- who failed where before each restart and at the end, a fresh
store per attempt -- is ``lib/elastic/supervision.py`` with the launcher's records
(``features/reliability``), applied in this process for the job's length.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.settings import ACTIVATE_ENV
from megatron_musa_patch.lib.elastic.supervision import supervised
from megatron_musa_patch.lib.heartbeat import Heartbeat, say


def parser():
    """torchrun's own parser (its options, then the script and its arguments), as ``mmp run``."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "mmp run"
    parser.description = ("torchrun with the layer active in every rank: torchrun's options, then "
                          "the training script and its arguments, unchanged. --max-restarts N "
                          "restarts a group whose rank died or hung, from the latest checkpoint.")
    parser.epilog = ("Exit status: 0 the job finished; 1 it failed (after its restarts; which rank, "
                     "where, and which checkpoint to resume from are said before); 2 a bad "
                     "option, or the layer refused to activate.")
    return parser


def run(argv: List[str]) -> int:
    doing = ["importing torch (torchrun's options)"]
    heartbeat = Heartbeat(say, lambda elapsed: f"mmp run: {doing[0]} ({elapsed:.0f} s)")
    heartbeat.notice()
    heartbeat.start()
    try:  # the same heartbeat goes on while the ranks start (supervised)
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import run as torchrun

        args = parser().parse_args(argv)
        script_args = list(args.training_script_args)
        if not args.no_python and not args.module and not os.path.isfile(args.training_script):
            raise ArgumentError(
                f"mmp run: the training script {args.training_script} does not exist (relative "
                f"to {os.getcwd()}). Fix the path (for Megatron-LM: "
                f"$MEGATRON_LM_PATH/pretrain_gpt.py), or pass -m for a module.")
        if not args.no_python and not args.module:
            doing[0] = f"checking {os.path.basename(args.training_script)}'s arguments"
            code = check_arguments(args.training_script, script_args, args.nnodes,
                                   args.nproc_per_node)
            if code is not None:
                return code
        # every Python process the job starts (data-loader or checkpoint workers too) activates
        os.environ[ACTIVATE_ENV] = "1"
        if not args.no_python:
            mode = "--module" if args.module else "--script"
            args.training_script_args = [mode, args.training_script, *args.training_script_args]
            args.training_script = "megatron_musa_patch.cli.run_worker"
            args.module = True
        from megatron_musa_patch.activation import launcher as launcher_side

        launcher = launcher_side.activate_launcher()
        try:
            with supervised(launcher.supervision, script_args, args.max_restarts,
                            heartbeat=heartbeat):
                torchrun(args)
        finally:
            launcher_side.deactivate_launcher()
    except ChildFailedError:
        return 1
    finally:
        heartbeat.stop()
    return 0


def check_arguments(script: str, script_args: List[str], nnodes: str,
                    nproc_per_node: str) -> Optional[int]:
    """Megatron's parser and validate_args on the script's arguments before any rank starts
    (``args_check``): the exit status when the job must not start (2: refused, said once; 0:
    ``--help`` printed), None to start the ranks."""
    from . import args_check

    ranks = args_check.world_size(nnodes, nproc_per_node)
    name = os.path.basename(script)
    if ranks is None or not args_check.wanted(script):
        print(f"mmp run: starting {name} ({_ranks_said(nnodes, nproc_per_node)})", flush=True)
        return None
    local = ranks // max(int(str(nnodes).split(":", 1)[0]), 1)
    print(f"mmp run: checking {name}'s arguments with Megatron's parser for {ranks} ranks, then "
          f"starting them", flush=True)
    # "gpu" / "auto" had torch ask the driver about the devices: no fork after that
    verdict = args_check.check(script, script_args, ranks, local,
                               may_fork=str(nproc_per_node).isdigit())
    if verdict.status == "refused":
        print(verdict.text, file=sys.stderr, flush=True)
        return 2
    if verdict.status == "printed":
        print(verdict.text, end="", flush=True)
        return 0
    if verdict.status == "unknown":  # the ranks will tell; say why the launcher could not
        print(f"mmp run: the arguments were not checked before the start ({verdict.text})",
              flush=True)
    return None


def _ranks_said(nnodes: str, nproc_per_node: str) -> str:
    return f"--nnodes {nnodes} --nproc-per-node {nproc_per_node}"
