"""Rank 3's hang watchdog around two training steps (``sys.argv``: the report directory, the
timeout in seconds, and ``hang`` or ``keep``): the second step hangs in ``waits_forever`` until
the watchdog ends the process, or keeps its deadline and the process exits cleanly.

Run by tests/features/reliability/test_hang_watchdog.py."""

import sys
import time

from megatron_musa_patch.lib.elastic.watchdog import Deadlines, Watchdog


def waits_forever():
    time.sleep(30)


def main(report_dir, timeout, how):
    dog = Watchdog.for_rank(Deadlines(timeout=float(timeout), first=1.0), 3, report_dir)
    dog.in_loop = True
    with dog.section("step", "training step of iteration 1"):
        time.sleep(0.1)
    with dog.section("step", "training step of iteration 2"):
        if how == "hang":
            waits_forever()  # the report's innermost frame
        else:
            time.sleep(0.2)


if __name__ == "__main__":
    main(*sys.argv[1:])
