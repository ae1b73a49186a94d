"""One rank of ``mmp selftest``: the tiny megatron-core GPT (``tiny_gpt``) trained for a few
steps.

Run under torchrun: ``python -m megatron_musa_patch.cli.selftest_worker --tp 2 --pp 1 ...``.
Every layout starts from the same weights (saved by the 1-rank reference with megatron-core's
distributed checkpointing and resharded on load), sees the same global batches, and trains
with dropout off in fp32, so its per-step loss must match the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import megatron_musa_patch  # noqa: F401 - activates before Megatron is imported

import torch  # noqa: E402

from megatron_musa_patch.cli import tiny_gpt  # noqa: E402

D = tiny_gpt.DEFAULTS


def parse(argv):
    p = argparse.ArgumentParser(prog="megatron_musa_patch.cli.selftest_worker")
    p.add_argument("--tp", type=int, default=D["tp"])
    p.add_argument("--pp", type=int, default=D["pp"])
    p.add_argument("--vpp", type=int, default=D["vpp"], help="virtual stages per pipeline rank")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--ep", type=int, default=D["ep"], help="expert-parallel size (MoE models)")
    p.add_argument("--experts", type=int, default=D["experts"],
                   help="MoE experts per layer (0: dense)")
    p.add_argument("--topk", type=int, default=D["topk"])
    p.add_argument("--dispatcher", default=D["dispatcher"], choices=("alltoall", "allgather"))
    p.add_argument("--device-loss", type=float, default=D["device_loss"],
                   help="moe_device_level_aux_loss_coeff set on the config (megatron-core way)")
    p.add_argument("--comm-loss", type=float, default=D["comm_loss"],
                   help="moe_comm_aux_loss_coeff")
    p.add_argument("--device-capacity", type=float, default=D["device_capacity"],
                   help="capacity factor applied per device (moe_device_level_capacity)")
    p.add_argument("--mla", action="store_true", help="multi-latent attention")
    for name in ("steps", "layers", "hidden", "heads", "seq", "vocab", "global_batch",
                 "micro_batch", "seed"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=D[name])
    p.add_argument("--lr", type=float, default=D["lr"])
    p.add_argument("--save-init", help="save the initial weights here (reference run)")
    p.add_argument("--load-init", help="start from these weights (parallel layouts)")
    p.add_argument("--out", required=True, help="JSON result written by rank 0")
    return p.parse_args(argv)


def main(argv=None):
    opts = parse(sys.argv[1:] if argv is None else argv)
    from megatron.core import dist_checkpointing

    tiny_gpt.init_parallel(opts)
    tiny_gpt.seed(opts.seed)
    models, config = tiny_gpt.build_chunks(opts)

    if opts.save_init:
        os.makedirs(opts.save_init, exist_ok=True)
        dist_checkpointing.save(models[0].sharded_state_dict(prefix=""), opts.save_init)
    if opts.load_init:
        # one load for all virtual chunks: the checkpoint's shards must be covered together
        wanted = {f"chunk{i}": m.sharded_state_dict(prefix="") for i, m in enumerate(models)}
        state = dist_checkpointing.load(wanted, opts.load_init)
        for i, model in enumerate(models):
            model.load_state_dict(state[f"chunk{i}"])

    models, optimizer = tiny_gpt.wrap(models, config, lr=opts.lr,
                                      distributed_optimizer=opts.distributed_optimizer)
    losses, times = tiny_gpt.train_steps(models, optimizer, tiny_gpt.rank_batches(opts), opts)

    if torch.distributed.get_rank() == 0:
        from megatron_musa_patch import active_session
        from megatron_musa_patch.core.results import FAILED
        from megatron_musa_patch.core.table import render_table, summary

        session = active_session()
        with open(opts.out, "w") as f:
            json.dump({"layout": vars(opts), "world_size": torch.distributed.get_world_size(),
                       "device": session.device.name, "losses": losses,
                       "step_seconds": times, "patch_table": render_table(session),
                       "patch_summary": summary(session),
                       "patch_failed": any(r.status == FAILED
                                           for r in session.registry.results())}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
