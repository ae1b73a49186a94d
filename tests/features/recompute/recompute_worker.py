"""One rank of the recompute equivalence check (run under torchrun by
tests/features/recompute/test_megatron_core.py).

Trains a tiny megatron-core GPT (local spec, fp32 unless --bf16; the harness's batches, loss and
training steps, tests/harness/tiny_gpt.py, on a decoder block spec with MoE, MTP and MLA options)
for a few steps once without recompute and once per flag combination, with dropout off and on, from
the same initial weights and batches, in one process: the flags are read from the TransformerConfig
when a layer runs, so each run builds a fresh model whose config carries that combination. Each
run's per-step loss and every parameter's gradient (DDP's ``main_grad``, before the optimizer step)
are compared bit for bit with the run without recompute. Counters on the recompute machinery make
sure each flag really recomputed what it promises. Rank 0 writes the JSON result.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from tests.harness import tiny_gpt  # activates the layer before Megatron is imported

import torch  # noqa: E402

COMBOS = {
    "attn": ("attn_recompute",),
    "mlp": ("mlp_recompute",),
    "attn+mlp": ("attn_recompute", "mlp_recompute"),
    "attn+variance": ("attn_recompute", "recompute_variance"),
    "mlp+variance": ("mlp_recompute", "recompute_variance"),
    "attn+mlp+variance": ("attn_recompute", "mlp_recompute", "recompute_variance"),
    "variance": ("recompute_variance",),
    # with upstream's selective recompute of the modules our flags do not cover
    "attn+upstream_mlp": ("attn_recompute",),
    "mlp+variance+upstream_core_attn": ("mlp_recompute", "recompute_variance"),
    "variance+upstream_mlp": ("recompute_variance",),
    # MT-Megatron's RMSNorm variants (plugins recompute.mla_rms / recompute.mlp_rms)
    "q_rms": ("q_rms_recompute",),
    "q_rms+variance": ("q_rms_recompute", "recompute_variance"),
    "attn+mla_rms+q_rms": ("attn_recompute", "mla_rms_recompute", "q_rms_recompute"),
    "mlp_rms": ("mlp_rms_recompute",),
    "mlp_rms+variance": ("mlp_rms_recompute", "recompute_variance"),
    "mt_all": ("attn_recompute", "mlp_recompute", "recompute_variance", "mla_rms_recompute",
               "mlp_rms_recompute", "q_rms_recompute"),
}
UPSTREAM = {"upstream_mlp": ["mlp"], "upstream_core_attn": ["core_attn"]}
DEFAULT_COMBOS = ("attn", "mlp", "attn+mlp", "attn+variance", "mlp+variance",
                  "attn+mlp+variance", "variance")
FLAGS = ("attn_recompute", "mlp_recompute", "recompute_variance", "q_rms_recompute",
         "mla_rms_recompute", "mlp_rms_recompute")


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=None)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--experts", type=int, default=0, help="MoE layers with this many experts")
    p.add_argument("--moe-layer-freq", default="1", help="e.g. '[0,1]': dense then MoE")
    p.add_argument("--shared-expert", type=int, default=0, help="shared expert ffn size")
    p.add_argument("--shared-gate", action="store_true")
    p.add_argument("--dispatcher", default="alltoall")
    p.add_argument("--grouped-gemm", action="store_true", help="GroupedMLP experts")
    p.add_argument("--shared-overlap", action="store_true",
                   help="--moe-shared-expert-overlap (the dispatcher runs the shared expert)")
    p.add_argument("--mtp", type=int, default=0, help="MTP layers")
    p.add_argument("--mla", action="store_true")
    p.add_argument("--q-lora-rank", type=int, default=None, help="MLA query compression")
    p.add_argument("--qk-layernorm", action="store_true", help="MLA's q/kv RMSNorms")
    p.add_argument("--bias", action="store_true", help="linear biases (bias in bias-dropout-add)")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--combos", default=",".join(DEFAULT_COMBOS))
    p.add_argument("--dropouts", default="0.0,0.1")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- counters

COUNTS: Counter = Counter()
COUNTED = ("block recompute", "skipped linear forward", "norm recompute", "released recompute")


def install_counters():
    """Count block recomputes, skipped linears and norm recomputes (test instrumentation)."""
    from megatron_musa_patch.lib.recompute import blocks, deferred, norm_output

    call = blocks._BlockRun.__call__

    def counted_call(self, *tensors):
        if self.calls >= 1:
            COUNTS["block recompute"] += 1
        return call(self, *tensors)

    blocks._BlockRun.__call__ = counted_call
    impl = deferred.forward_impl

    def counted_impl(args, kwargs):
        COUNTS["skipped linear forward"] += 1
        return impl(args, kwargs)

    deferred.forward_impl = counted_impl
    from megatron_musa_patch.lib.recompute import grouped, released

    skip_gmm = grouped.SkipForwardGmm.forward

    def counted_skip_gmm(ctx, *args):
        COUNTS["skipped linear forward"] += 1
        return skip_gmm(ctx, *args)

    grouped.SkipForwardGmm.forward = staticmethod(counted_skip_gmm)
    restore_released = released.Released.restore

    def counted_restore_released(self, grad):
        if self.recompute is not None:
            COUNTS["released recompute"] += 1
        return restore_released(self, grad)

    released.Released.restore = counted_restore_released
    restore = norm_output.NormOutput.restore

    def counted_restore(self, grad):
        if self.output is not None:
            COUNTS["norm recompute"] += 1
        return restore(self, grad)

    norm_output.NormOutput.restore = counted_restore


# ----------------------------------------------------------------------------- model


def build(opts, combo, dropout, pre, post, vp_stage):
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec,
                                                          get_gpt_mtp_block_spec)
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                              TransformerConfig)

    dtype = torch.bfloat16 if opts.bf16 else torch.float32
    kwargs = dict(
        num_layers=opts.layers, hidden_size=opts.hidden, ffn_hidden_size=2 * opts.hidden,
        num_attention_heads=opts.heads, num_query_groups=opts.heads // 2,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        normalization="RMSNorm", add_bias_linear=opts.bias,
        hidden_dropout=dropout, attention_dropout=dropout,
        use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype, bf16=opts.bf16,
        tensor_model_parallel_size=opts.tp, pipeline_model_parallel_size=opts.pp,
        virtual_pipeline_model_parallel_size=opts.vpp,
        expert_model_parallel_size=opts.ep,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, bias_activation_fusion=False,
        persist_layer_norm=False,
        overlap_p2p_comm=opts.vpp is not None, batch_p2p_comm=opts.vpp is None,
        deallocate_pipeline_outputs=True,
    )
    if opts.experts:
        kwargs.update(num_moe_experts=opts.experts, moe_router_topk=2,
                      moe_ffn_hidden_size=opts.hidden, moe_token_dispatcher_type=opts.dispatcher,
                      moe_aux_loss_coeff=0.01, moe_layer_freq=eval(opts.moe_layer_freq),
                      moe_router_dtype="fp32")
        if opts.shared_expert:
            kwargs.update(moe_shared_expert_intermediate_size=opts.shared_expert,
                          moe_shared_expert_gate=opts.shared_gate,
                          moe_shared_expert_overlap=opts.shared_overlap)
        if opts.grouped_gemm:
            kwargs.update(moe_grouped_gemm=True)
    if opts.mtp:
        kwargs.update(mtp_num_layers=opts.mtp, mtp_loss_scaling_factor=0.3)
    flags = COMBOS.get(combo, ())
    upstream = [m for part in combo.split("+") for m in UPSTREAM.get(part, [])]
    if upstream:
        kwargs.update(recompute_granularity="selective", recompute_modules=upstream)
    if opts.mla:
        kwargs.update(q_lora_rank=opts.q_lora_rank, kv_lora_rank=16, qk_head_dim=8,
                      qk_pos_emb_head_dim=8, v_head_dim=8, rotary_scaling_factor=1.0,
                      num_query_groups=opts.heads, qk_layernorm=opts.qk_layernorm)
        config = MLATransformerConfig(**kwargs)
    else:
        config = TransformerConfig(**kwargs)
    for name in FLAGS:
        setattr(config, name, name in flags)
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                       normalization="RMSNorm", vp_stage=vp_stage)
    mtp = None
    if opts.mtp:
        mtp = get_gpt_mtp_block_spec(config, block.layer_specs[-1], use_transformer_engine=False,
                                     vp_stage=vp_stage)
    model = GPTModel(config=config, transformer_layer_spec=block, vocab_size=opts.vocab,
                     max_sequence_length=opts.seq, pre_process=pre, post_process=post,
                     share_embeddings_and_output_weights=False,
                     position_embedding_type="rope", vp_stage=vp_stage, mtp_block_spec=mtp)
    return model, config


def train(opts, combo, dropout):
    """Per-step losses and per-step {param name: main_grad copy} for one setting."""
    from megatron.core import parallel_state
    from megatron.core.optimizer import OptimizerConfig

    tiny_gpt.seed(opts.seed)
    models, config = tiny_gpt.build_chunks(
        opts, lambda o, pre, post, stage: build(o, combo, dropout, pre, post, stage))
    models, optimizer = tiny_gpt.wrap(models, config, OptimizerConfig(
        optimizer="adam", lr=1e-2, weight_decay=0.01, clip_grad=1.0, bf16=opts.bf16,
        use_distributed_optimizer=opts.distributed_optimizer))
    losses, grads = [], []

    def record(models, reduced):  # before the optimizer step: the gradients of this step
        grads.append({f"{i}.{name}": p.main_grad.detach().clone()
                      for i, m in enumerate(models) for name, p in m.named_parameters()})
        last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        losses.append([float(r["lm loss"].item()) for r in reduced] if last else [])

    tiny_gpt.train_steps(models, optimizer, tiny_gpt.rank_batches(opts), opts, before_step=record)
    return losses, grads


def compare(base, run):
    """(losses equal, names of parameters whose gradient differs, largest difference)."""
    (base_losses, base_grads), (losses, grads) = base, run
    differing, worst = set(), 0.0
    for step_base, step in zip(base_grads, grads):
        assert step_base.keys() == step.keys()
        for name, g in step_base.items():
            if not torch.equal(g, step[name]):
                differing.add(name)
                worst = max(worst, float((g.double() - step[name].double()).abs().max()))
    return base_losses == losses, sorted(differing), worst


def main(argv=None):
    opts = parse(sys.argv[1:] if argv is None else argv)
    tiny_gpt.init_parallel(opts)
    install_counters()
    combos = [c for c in opts.combos.split(",") if c]
    results = {}
    for dropout in [float(d) for d in opts.dropouts.split(",")]:
        COUNTS.clear()
        base = train(opts, "none", dropout)
        assert not COUNTS, f"recompute ran without a flag: {dict(COUNTS)}"
        for combo in combos:
            COUNTS.clear()
            run = train(opts, combo, dropout)
            same_loss, differing, worst = compare(base, run)
            flags = torch.tensor([float(same_loss), float(not differing)])
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
            counts = torch.tensor([COUNTS[k] for k in COUNTED], dtype=torch.float64)
            torch.distributed.all_reduce(counts)
            results[f"{combo} dropout={dropout}"] = {
                "losses_equal": bool(flags[0]), "grads_equal": bool(flags[1]),
                "differing_on_rank0": differing[:8], "max_abs_diff_rank0": worst,
                "losses": run[0], "base_losses": base[0],
                "counts": dict(zip(COUNTED, counts.tolist())),
            }
    if torch.distributed.get_rank() == 0:
        with open(opts.out, "w") as f:
            json.dump({"layout": vars(opts), "results": results}, f, indent=1)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
