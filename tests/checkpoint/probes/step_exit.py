"""A conversion step's last moments: it starts a results manager with the ``spawn`` context, as
megatron-core's checkpoint writer does, prints the manager's pid, leaves output unflushed on both
streams, and ends through the worker's ``_leave`` with status 3."""

import multiprocessing
import sys

from megatron_musa_patch.checkpoint.worker import _leave

if __name__ == "__main__":  # a spawned child imports this module again
    manager = multiprocessing.get_context("spawn").Manager()
    manager.Queue()
    print(manager._process.pid)
    print("the last words, unflushed", end="")
    sys.stderr.write("and to stderr")
    _leave(3)
