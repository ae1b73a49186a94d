"""One rank of ``mmp selftest``: a tiny megatron-core GPT trained for a few steps.

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
import time
from functools import partial

import megatron_musa_patch  # noqa: F401 - activates before Megatron is imported

import torch  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(prog="megatron_musa_patch.cli.selftest_worker")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--vpp", type=int, default=None, help="virtual stages per pipeline rank")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (MoE models)")
    p.add_argument("--experts", type=int, default=0, help="MoE experts per layer (0: dense)")
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--dispatcher", default="alltoall", choices=("alltoall", "allgather"))
    p.add_argument("--device-loss", type=float, default=0.0,
                   help="moe_device_level_aux_loss_coeff set on the config (megatron-core way)")
    p.add_argument("--comm-loss", type=float, default=0.0, help="moe_comm_aux_loss_coeff")
    p.add_argument("--device-capacity", type=float, default=None,
                   help="capacity factor applied per device (moe_device_level_capacity)")
    p.add_argument("--mla", action="store_true", help="multi-latent attention")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save-init", help="save the initial weights here (reference run)")
    p.add_argument("--load-init", help="start from these weights (parallel layouts)")
    p.add_argument("--out", required=True, help="JSON result written by rank 0")
    return p.parse_args(argv)


def build_model(opts, pre_process, post_process, vp_stage=None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe = dict(
        num_moe_experts=opts.experts, moe_router_topk=opts.topk, moe_ffn_hidden_size=opts.hidden,
        moe_token_dispatcher_type=opts.dispatcher, moe_aux_loss_coeff=0.01,
        moe_shared_expert_intermediate_size=opts.hidden, expert_model_parallel_size=opts.ep,
        moe_expert_capacity_factor=opts.device_capacity,
    ) if opts.experts else {}
    mla = dict(
        multi_latent_attention=True, q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16,
        qk_pos_emb_head_dim=8, v_head_dim=16, qk_layernorm=True,
    ) if opts.mla else {}
    config_class = TransformerConfig
    if opts.mla:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config_class = MLATransformerConfig
    config = config_class(
        **moe, **mla,
        num_layers=opts.layers,
        hidden_size=opts.hidden,
        ffn_hidden_size=2 * opts.hidden,
        num_attention_heads=opts.heads,
        num_query_groups=opts.heads if opts.mla else opts.heads // 2,  # MLA has no GQA
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        tensor_model_parallel_size=opts.tp,
        pipeline_model_parallel_size=opts.pp,
        virtual_pipeline_model_parallel_size=opts.vpp,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        # Megatron-LM's defaults for the interleaved schedule; batched p2p on 2 stages pairs
        # each rank's send_prev/send_next with the peer's recvs in posting order
        overlap_p2p_comm=opts.vpp is not None,
        batch_p2p_comm=opts.vpp is None,
        deallocate_pipeline_outputs=True,  # as Megatron-LM sets it
    )
    # the device-level balancing flags, set the way a megatron-core-only user sets them
    config.moe_device_level_aux_loss_coeff = opts.device_loss
    config.moe_comm_aux_loss_coeff = opts.comm_loss
    config.moe_device_level_capacity = opts.device_capacity is not None
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(
            num_experts=opts.experts or None, normalization="RMSNorm",
            multi_latent_attention=opts.mla, qk_layernorm=opts.mla),
        vocab_size=opts.vocab,
        max_sequence_length=opts.seq,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        vp_stage=vp_stage,
    )
    return model, config


def batches(opts, dp_rank, dp_size):
    """Deterministic learnable sequences (next token = token + 1), the same global batches for
    every layout; each data-parallel rank takes its slice, split into micro-batches."""
    gen = torch.Generator().manual_seed(opts.seed)
    per_rank = opts.global_batch // dp_size
    for _ in range(opts.steps):
        starts = torch.randint(0, opts.vocab, (opts.global_batch, 1), generator=gen)
        seqs = (starts + torch.arange(opts.seq + 1)) % opts.vocab
        mine = seqs[dp_rank * per_rank:(dp_rank + 1) * per_rank]
        yield [mine[i:i + opts.micro_batch] for i in range(0, per_rank, opts.micro_batch)]


def forward_step(data_iterator, model, seq):
    sample = next(data_iterator).to("cuda")  # 'cuda' means this device: exercised on purpose
    tokens, labels = sample[:, :-1].contiguous(), sample[:, 1:].contiguous()
    position_ids = torch.arange(seq, device=torch.cuda.current_device()).unsqueeze(0)
    mask = torch.ones(1, 1, seq, seq, dtype=torch.bool, device="cuda").triu(1)
    output = model(tokens, position_ids, mask, labels=labels)

    def loss_func(output_tensor):
        loss = output_tensor.float().mean()
        return loss, {"lm loss": loss.detach().clone()}

    return output, loss_func


def main(argv=None):
    opts = parse(sys.argv[1:] if argv is None else argv)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(backend="nccl")  # mapped to the device's backend
    parallel_state.initialize_model_parallel(
        opts.tp, opts.pp, virtual_pipeline_model_parallel_size=opts.vpp,
        expert_model_parallel_size=opts.ep)
    torch.manual_seed(opts.seed)
    model_parallel_cuda_manual_seed(opts.seed)

    chunks = opts.vpp or 1
    models, config = [], None
    for vp in range(chunks):
        vp_stage = vp if opts.vpp else None
        pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        model, config = build_model(opts, pre, post, vp_stage)
        models.append(model.to("cuda"))

    if opts.save_init:
        os.makedirs(opts.save_init, exist_ok=True)
        dist_checkpointing.save(models[0].sharded_state_dict(prefix=""), opts.save_init)
    if opts.load_init:
        # one load for all virtual chunks: the checkpoint's shards must be covered together
        wanted = {f"chunk{i}": m.sharded_state_dict(prefix="") for i, m in enumerate(models)}
        state = dist_checkpointing.load(wanted, opts.load_init)
        for i, model in enumerate(models):
            model.load_state_dict(state[f"chunk{i}"])

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=opts.distributed_optimizer)
    models = [DistributedDataParallel(config, ddp_config, m, disable_bucketing=(i > 0))
              for i, m in enumerate(models)]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=opts.lr, weight_decay=0.01, clip_grad=1.0,
                        use_distributed_optimizer=opts.distributed_optimizer),
        models)
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = [m.no_sync for m in models] if chunks > 1 else models[0].no_sync

    step_batches = batches(opts, parallel_state.get_data_parallel_rank(),
                           parallel_state.get_data_parallel_world_size())
    losses, times = train_steps(models, optimizer, step_batches, opts)

    if torch.distributed.get_rank() == 0:
        from megatron_musa_patch import active_session
        from megatron_musa_patch.core.table import render_table

        with open(opts.out, "w") as f:
            json.dump({"layout": vars(opts), "world_size": torch.distributed.get_world_size(),
                       "device": active_session().device.name, "losses": losses,
                       "step_seconds": times, "patch_table": render_table(active_session())}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def train_steps(models, optimizer, step_batches, opts):
    """One optimizer step per item of ``step_batches`` (that step's micro-batches) on ``models``
    (the model chunks of this pipeline rank; one without a virtual pipeline). Returns the
    global loss and the seconds of every step."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

    forward_backward = get_forward_backward_func()
    chunks = len(models)
    losses, times = [], []
    for micro_batches in step_batches:
        start = time.perf_counter()
        for m in models:
            m.zero_grad_buffer()
        optimizer.zero_grad()
        iterators = [iter(micro_batches) for _ in models] if chunks > 1 else iter(micro_batches)
        reduced = forward_backward(
            forward_step_func=partial(forward_step, seq=opts.seq), data_iterator=iterators,
            model=models if chunks > 1 else models[0], num_microbatches=len(micro_batches),
            seq_length=opts.seq, micro_batch_size=opts.micro_batch, forward_only=False)
        ok, _, _ = optimizer.step()
        assert ok, "optimizer step was skipped"
        times.append(time.perf_counter() - start)
        losses.append(_global_loss(reduced, parallel_state))
    return losses, times


def _global_loss(reduced, parallel_state):
    """Mean 'lm loss' over micro-batches and data-parallel ranks, known on every rank."""
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        local = torch.stack([r["lm loss"] for r in reduced]).mean().reshape(1)
        torch.distributed.all_reduce(local, group=parallel_state.get_data_parallel_group())
        local /= parallel_state.get_data_parallel_world_size()
    else:
        local = torch.zeros(1, device="cuda")
    last_stage = parallel_state.get_pipeline_model_parallel_last_rank()
    torch.distributed.broadcast(local, src=last_stage,
                                group=parallel_state.get_pipeline_model_parallel_group())
    return float(local.item())


if __name__ == "__main__":
    main()
