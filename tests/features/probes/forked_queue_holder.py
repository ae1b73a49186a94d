"""A process that holds a Manager queue and waits to be killed: ``feature`` makes it with
features/startup/forked_write_queue.py's ``forked_queue``, ``plain`` as a plain forked Manager would.
Prints the manager's pid once the queue answers.

Run by tests/features/startup/test_forked_write_queue.py."""

import multiprocessing
import sys
import time

from megatron_musa_patch.features.startup.forked_write_queue import forked_queue


def main(kind: str) -> None:
    if kind == "feature":
        queue = forked_queue()
    else:
        queue = multiprocessing.get_context("fork").Manager().Queue()
    queue.put("result")
    assert queue.get() == "result"
    print(queue._manager._process.pid, flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main(sys.argv[1])
