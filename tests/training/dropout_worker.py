"""One rank of tests/training/test_determinism.py: the harness's tiny GPT (tests/harness/
tiny_gpt.py) with dropout on in its TransformerConfig, TP2, 3 steps from ``--seed``. Rank 0
writes the device, the world size and the per-step losses."""

from __future__ import annotations

import argparse
import json
from functools import partial

from tests.harness import tiny_gpt  # activates the layer before Megatron is imported

import torch  # noqa: E402

DROPOUT = 0.1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    opts = tiny_gpt.options(tp=2, steps=3, layers=2, seed=args.seed)
    tiny_gpt.init_parallel(opts)
    tiny_gpt.seed(opts.seed)
    models, config = tiny_gpt.build_chunks(opts, partial(
        tiny_gpt.build_model, hidden_dropout=DROPOUT, attention_dropout=DROPOUT))
    models, optimizer = tiny_gpt.wrap(models, config)
    losses, _ = tiny_gpt.train_steps(models, optimizer, tiny_gpt.rank_batches(opts), opts)
    if torch.distributed.get_rank() == 0:
        from megatron_musa_patch import active_session

        with open(args.out, "w") as f:
            json.dump({"device": active_session().device.name,
                       "world_size": torch.distributed.get_world_size(), "losses": losses}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
