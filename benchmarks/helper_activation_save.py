"""One rank of bench_helper_activation.py: the tiny selftest GPT in DP2 on CPU ranks, one
``dist_checkpointing.save`` of its weights, the seconds it took on this rank written as JSON.

Nothing but the standard library is imported at the top: the Manager that dist_checkpointing's
writer spawns imports this file again as ``__mp_main__``, and what it costs there is what the
benchmark measures, not this script's imports.

    mmp run --standalone --nproc-per-node 2 benchmarks/helper_activation_save.py OUT_DIR
"""

import json
import os
import sys
import time


def main(out_dir: str) -> None:
    import torch
    from megatron.core import dist_checkpointing

    from megatron_musa_patch.cli import tiny_gpt

    opts = tiny_gpt.options(layers=4, hidden=256, heads=4, seq=128, vocab=4096)
    tiny_gpt.init_parallel(opts)
    tiny_gpt.seed(opts.seed)
    (model,), _ = tiny_gpt.build_chunks(opts)
    rank = torch.distributed.get_rank()
    ckpt = os.path.join(out_dir, "ckpt")
    if rank == 0:
        os.makedirs(ckpt, exist_ok=True)
    torch.distributed.barrier()
    begin = time.perf_counter()
    dist_checkpointing.save(model.sharded_state_dict(prefix=""), ckpt)
    took = time.perf_counter() - begin
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"save_s": took}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
