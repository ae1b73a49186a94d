"""One rank of the fusion-defaults check (run under torchrun by
tests/features/fused_ops/test_megatron_core.py).

The harness's tiny GPT (tests/harness/tiny_gpt.py) trained a few steps with each requested
variant in turn, in one process: ``unfused`` (every fusion off, as the --no-* flags set it) and
``fused`` (upstream's defaults: persist_layer_norm, gradient-accumulation, bias-activation,
bias-dropout, masked-softmax and RoPE fusion on) -- the latter with ``sequence_parallel`` when
asked. Rank 0 writes ``{variant: {losses, norms, sequence_parallel_params}}``.
"""

from __future__ import annotations

import argparse
import json
import sys

from tests.harness import tiny_gpt  # activates the layer before Megatron is imported

import torch  # noqa: E402

FUSIONS = ("persist_layer_norm", "gradient_accumulation_fusion", "bias_activation_fusion",
           "bias_dropout_fusion", "masked_softmax_fusion", "apply_rope_fusion")


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--variants", default="unfused,fused", help="unfused, fused, fused+sp")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def train(opts, variant):
    fused, sequence_parallel = variant != "unfused", variant.endswith("+sp")
    tiny_gpt.seed(opts.seed)
    model, config = tiny_gpt.build_model(opts, True, True, sequence_parallel=sequence_parallel,
                                         **{name: fused for name in FUSIONS})
    models, optimizer = tiny_gpt.wrap([model.to("cuda")], config, lr=opts.lr)
    losses = tiny_gpt.train_steps(models, optimizer, tiny_gpt.rank_batches(opts), opts)[0]
    norms = sorted({type(m).__module__ + "." + type(m).__name__ for m in model.modules()
                    if "Norm" in type(m).__name__})
    marked = sum(1 for p in model.parameters() if getattr(p, "sequence_parallel", False))
    return {"losses": losses, "norms": norms, "sequence_parallel_params": marked}


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    opts = tiny_gpt.options(tp=args.tp, steps=3, layers=2, hidden=48, heads=4, seq=24, vocab=96,
                            global_batch=4, micro_batch=2)
    tiny_gpt.init_parallel(opts)
    result = {variant: train(opts, variant) for variant in args.variants.split(",")}
    if torch.distributed.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
