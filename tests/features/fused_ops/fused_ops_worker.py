"""One rank of the fusion-defaults check (run under torchrun by tests/features/fused_ops/test_megatron_core.py).

A tiny megatron-core GPT (local spec, Llama-style: RMSNorm, SwiGLU, RoPE, fp32, dropout off,
CPU initialisation so every layout starts from the same full weights) trained a few steps with
each requested variant in turn, in one process: ``unfused`` (every fusion off, as the --no-*
flags set it) and ``fused`` (upstream's defaults: persist_layer_norm, gradient-accumulation,
bias-activation, bias-dropout, masked-softmax and RoPE fusion on) -- the latter with
``sequence_parallel`` when asked. Rank 0 writes ``{variant: [loss per step]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import megatron_musa_patch  # noqa: F401 - activates before Megatron is imported

import torch  # noqa: E402

from megatron_musa_patch.cli.selftest_worker import batches, train_steps  # noqa: E402

FUSIONS = ("persist_layer_norm", "gradient_accumulation_fusion", "bias_activation_fusion",
           "bias_dropout_fusion", "masked_softmax_fusion", "apply_rope_fusion")


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--variants", default="unfused,fused", help="unfused, fused, fused+sp")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=48)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=24)
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def build(opts, fused, sequence_parallel):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=opts.layers, hidden_size=opts.hidden, ffn_hidden_size=2 * opts.hidden,
        num_attention_heads=opts.heads, num_query_groups=opts.heads // 2,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float32,
        pipeline_dtype=torch.float32, tensor_model_parallel_size=opts.tp,
        sequence_parallel=sequence_parallel, deallocate_pipeline_outputs=True,
        **{name: fused for name in FUSIONS})
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=opts.vocab, max_sequence_length=opts.seq, pre_process=True, post_process=True,
        share_embeddings_and_output_weights=False, position_embedding_type="rope")
    return model.to("cuda"), config


def train(opts, variant):
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(opts.seed)
    model_parallel_cuda_manual_seed(opts.seed)
    model, config = build(opts, variant != "unfused", variant.endswith("+sp"))
    model = DistributedDataParallel(config, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True), model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=opts.lr, weight_decay=0.01, clip_grad=1.0), [model])
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = model.no_sync
    step_batches = batches(opts, parallel_state.get_data_parallel_rank(),
                           parallel_state.get_data_parallel_world_size())
    losses = train_steps([model], optimizer, step_batches, opts)[0]
    norms = sorted({type(m).__module__ + "." + type(m).__name__ for m in model.modules()
                    if "Norm" in type(m).__name__})
    marked = sum(1 for p in model.parameters() if getattr(p, "sequence_parallel", False))
    return {"losses": losses, "norms": norms, "sequence_parallel_params": marked}


def main(argv=None):
    opts = parse(sys.argv[1:] if argv is None else argv)
    from megatron.core import parallel_state

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(backend="nccl")
    parallel_state.initialize_model_parallel(opts.tp, 1)
    result = {variant: train(opts, variant) for variant in opts.variants.split(",")}
    if torch.distributed.get_rank() == 0:
        with open(opts.out, "w") as f:
            json.dump(result, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
