"""The tiny megatron-core GPT that ``mmp selftest`` trains: its shape, its model chunks, its
batches and its training steps, on whatever device the layer has mapped ``cuda`` to.

Llama-style on the local spec (RMSNorm, SwiGLU, RoPE, GQA), fp32, dropout and fusions off, CPU
initialisation so every parallel layout starts from the same full weights. Optional MoE
(experts, top-k, dispatcher, the device-level balancing flags set the megatron-core way) and
MLA. The selftest's worker (``selftest_worker``) is its command line; the test suite drives the
same model through ``tests/harness/tiny_gpt.py``, so what the tests train is what a user's
``mmp selftest`` trains.
"""

from __future__ import annotations

import os
import time
import types
from functools import partial

import torch

#: the model and the run, as ``options()`` and the selftest's flags default them
DEFAULTS = dict(
    tp=1, pp=1, vpp=None, ep=1, distributed_optimizer=False,
    experts=0, topk=2, dispatcher="alltoall", device_loss=0.0, comm_loss=0.0,
    device_capacity=None, mla=False,
    steps=4, layers=4, hidden=64, heads=4, seq=32, vocab=128, global_batch=8, micro_batch=2,
    lr=1e-2, seed=1234,
)


def options(**overrides) -> types.SimpleNamespace:
    """The run's options: ``DEFAULTS`` with ``overrides`` (an unknown name is a typo: refused)."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"tiny_gpt.options: unknown option(s) {unknown}; known: {sorted(DEFAULTS)}")
    return types.SimpleNamespace(**{**DEFAULTS, **overrides})


def init_parallel(opts) -> None:
    """This rank's device, the process group (``nccl``, mapped to the device's backend) and
    megatron-core's parallel state for ``opts``' layout."""
    from megatron.core import parallel_state

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(backend="nccl")
    parallel_state.initialize_model_parallel(
        opts.tp, opts.pp, virtual_pipeline_model_parallel_size=opts.vpp,
        expert_model_parallel_size=opts.ep)


def seed(value: int) -> None:
    """Seed torch and megatron-core's model-parallel RNG tracker (weights, dropout)."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.manual_seed(value)
    model_parallel_cuda_manual_seed(value)


def build_model(opts, pre_process, post_process, vp_stage=None, **config_overrides):
    """One model chunk and its config; ``config_overrides`` replace TransformerConfig fields
    (a fusion switched on, sequence parallelism, ...)."""
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
    fields = dict(
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
    config = config_class(**{**fields, **config_overrides})
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


def build_chunks(opts, build=build_model):
    """This pipeline rank's model chunks (one per virtual stage, else one), on the device, and
    their config; ``build(opts, pre_process, post_process, vp_stage)`` makes one chunk."""
    from megatron.core import parallel_state

    models, config = [], None
    for vp in range(opts.vpp or 1):
        vp_stage = vp if opts.vpp else None
        pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        model, config = build(opts, pre, post, vp_stage)
        models.append(model.to("cuda"))
    return models, config


def wrap(models, config, optimizer_config=None, *, distributed_optimizer=False, lr=1e-2):
    """``models`` in megatron-core's DistributedDataParallel and their optimizer (Adam unless
    ``optimizer_config`` says otherwise), wired into ``config`` as Megatron-LM's training loop
    wires them: gradient finalisation, loss scaling, no_sync."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    if optimizer_config is None:
        optimizer_config = OptimizerConfig(
            optimizer="adam", lr=lr, weight_decay=0.01, clip_grad=1.0,
            use_distributed_optimizer=distributed_optimizer)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=optimizer_config.use_distributed_optimizer)
    models = [DistributedDataParallel(config, ddp_config, m, disable_bucketing=(i > 0))
              for i, m in enumerate(models)]
    optimizer = get_megatron_optimizer(optimizer_config, models)
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = [m.no_sync for m in models] if len(models) > 1 else models[0].no_sync
    return models, optimizer


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


def rank_batches(opts):
    """``batches`` for this rank's data-parallel slice."""
    from megatron.core import parallel_state

    return batches(opts, parallel_state.get_data_parallel_rank(),
                   parallel_state.get_data_parallel_world_size())


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


def train_steps(models, optimizer, step_batches, opts, before_step=None):
    """One optimizer step per item of ``step_batches`` (that step's micro-batches) on ``models``
    (the model chunks of this pipeline rank; one without a virtual pipeline). Returns the
    global loss and the seconds of every step. ``before_step(models, reduced)``, if given, sees
    each step's gradients and per-micro-batch losses before the optimizer steps."""
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
        if before_step is not None:
            before_step(models, reduced)
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
