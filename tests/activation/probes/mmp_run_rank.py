"""A training script for ``mmp run``, run as ``__main__`` in every rank: it all-reduces over
the default group and writes ``RANK <rank> <__name__> <argv> <sum> <backend>`` to a file
``rank<RANK>`` beside itself. The test copies it into its temporary directory and runs it from
there.

Run by tests/activation/test_activation.py."""

import os
import sys

import torch

if __name__ == "__main__":
    torch.distributed.init_process_group("nccl")
    t = torch.ones(1, device="cuda") * (torch.distributed.get_rank() + 1)
    torch.distributed.all_reduce(t)
    line = " ".join(map(str, ["RANK", os.environ["RANK"], __name__, sys.argv[1:], t.item(),
                              torch.distributed.get_backend()]))
    with open(os.path.join(os.path.dirname(__file__), "rank" + os.environ["RANK"]), "w") as f:
        f.write(line)
