"""``mmp run``: torchrun with the layer active in every rank.

Takes torchrun's own options (``--nproc-per-node``, ``--nnodes``, ``--rdzv-*``, ``--master-*``,
``--node-rank`` ...), parsed by torchrun's parser, so multi-node launches work unchanged.
"""

from __future__ import annotations

import os
import sys
from typing import List


def run(argv: List[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    parser = get_args_parser()
    parser.prog = "mmp run"
    args = parser.parse_args(argv)
    # every Python process the job starts (data-loader or checkpoint workers too) activates
    os.environ["MEGATRON_MUSA_PATCH"] = "1"
    if not args.no_python:
        mode = "--module" if args.module else "--script"
        args.training_script_args = [mode, args.training_script, *args.training_script_args]
        args.training_script = "megatron_musa_patch.worker"
        args.module = True
    try:
        torchrun(args)
    except ChildFailedError as exc:
        failures = ", ".join(
            f"rank {rank} (exit {failure.exitcode})" for rank, failure in exc.failures.items())
        print(f"mmp run: {failures} failed; the first error is printed above.", file=sys.stderr)
        return 1
    return 0
