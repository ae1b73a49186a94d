"""A training script for ``mmp run`` whose rank 1 dies by SIGKILL mid-run, while rank 0 waits in
a collective, leaving behind a child that holds the job's stdout (as megatron-core's checkpoint
writer's multiprocessing Manager does); it prints ``leftover child pid=<pid>`` to stderr first.
The test copies it into its temporary directory.

Run by tests/project/test_bad_inputs.py."""

import os
import signal
import subprocess
import sys
import time

import torch


def main():
    torch.distributed.init_process_group("nccl")
    t = torch.ones(1, device="cuda")
    for step in range(10000):
        if step == 20 and torch.distributed.get_rank() == 1:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
            print(f"leftover child pid={child.pid}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # mid-run, while rank 0 is in a collective
        torch.distributed.all_reduce(t)
        time.sleep(0.01)


if __name__ == "__main__":
    main()
