"""Rank ``argv[1]`` raises an AssertionError; its peer, waiting in a collective, loses its
connection. The raising rank's process group goes away before its process does (an atexit
handler that sleeps after destroying it), so the peer exits 1 first and the agent stops the
raising rank with SIGTERM: the exit statuses alone would blame the peer."""

import atexit
import sys
import time

import torch
import torch.distributed as dist

guilty = int(sys.argv[1])
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == guilty:
    def slow_exit():
        dist.destroy_process_group()
        time.sleep(5)

    atexit.register(slow_exit)
    raise AssertionError("no sample to consume: 0")
dist.all_reduce(torch.zeros(1))
