"""One rank of a 2-rank torchrun job with one restart: attempt 0 writes its address key both
into torchrun's store and under restart_store's per-attempt prefix, then rank 1 fails; in the
restarted attempt each rank prints whether attempt 0's key is still there in each store
(``rank R raw=... prefixed=...``).

Run by tests/features/reliability/test_hang_watchdog.py (``torchrun -m``)."""

import datetime
import os
import sys

import torch.distributed as dist

from megatron_musa_patch.features.reliability import restart_store


def main():
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                        is_master=False, timeout=datetime.timedelta(seconds=30))
    mine = restart_store.attempt_store(restart_store.attempt_prefix(os.environ), os.environ,
                                       datetime.timedelta(seconds=30))
    if attempt == "0":
        raw.set(f"addr{rank}", "attempt 0")
        mine.set(f"addr{rank}", "attempt 0")
        mine.wait(["addr0", "addr1"])
        if rank == "1":
            sys.exit(3)  # the failure torchrun restarts the group for
    else:
        print(f"rank {rank} raw={raw.check(['addr1'])} prefixed={mine.check(['addr1'])}",
              flush=True)


if __name__ == "__main__":
    main()
