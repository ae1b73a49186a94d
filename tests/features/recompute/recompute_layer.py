"""Transformer layers of megatron-core (local spec) measured per recompute setting.

For one setting: the bytes each layer holds for backward (its attention block and its MLP block
separately, its MoE experts, and per layer in a block of layers). Shared by
tests/features/recompute/test_megatron_core.py (the memory promises) and
benchmarks/bench_recompute.py. Runs in one process (a 1-rank process group); activate the layer
before importing this.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Dict, Tuple

import torch

from megatron_musa_patch.lib.recompute.accounting import SavedBytes

#: setting -> (our flags, upstream TransformerConfig overrides)
SETTINGS: Dict[str, Tuple[tuple, dict]] = {
    "none": ((), {}),
    "upstream full": ((), dict(recompute_granularity="full", recompute_method="uniform",
                               recompute_num_layers=1)),
    "upstream selective core_attn": ((), dict(recompute_granularity="selective",
                                              recompute_modules=["core_attn"])),
    "variance": (("recompute_variance",), {}),
    "attn": (("attn_recompute",), {}),
    "attn+variance": (("attn_recompute", "recompute_variance"), {}),
    "mlp": (("mlp_recompute",), {}),
    "mlp+variance": (("mlp_recompute", "recompute_variance"), {}),
    "attn+mlp": (("attn_recompute", "mlp_recompute"), {}),
    "attn+mlp+variance": (("attn_recompute", "mlp_recompute", "recompute_variance"), {}),
    "mlp_rms": (("mlp_rms_recompute",), {}),  # MT-Megatron's --mlp-rms-recompute
}
FLAGS = ("attn_recompute", "mlp_recompute", "recompute_variance", "mlp_rms_recompute")


@dataclasses.dataclass
class Shape:
    hidden: int = 64
    heads: int = 4
    query_groups: int = 4
    ffn: int = 256
    seq: int = 64
    batch: int = 2
    layers: int = 2
    swiglu: bool = False
    experts: int = 0
    shared_expert: int = 0
    shared_overlap: bool = False  # --moe-shared-expert-overlap
    grouped: bool = False  # --moe-grouped-gemm (GroupedMLP)
    dtype: torch.dtype = torch.float32

    def describe(self) -> str:
        kind = f", {self.experts} experts (top-2)" if self.experts else ""
        return (f"hidden {self.hidden}, {self.heads} heads ({self.query_groups} query groups), "
                f"ffn {self.ffn}{' SwiGLU' if self.swiglu else ' GeLU'}, seq {self.seq}, "
                f"micro-batch {self.batch}, {self.layers} layers, "
                f"{str(self.dtype).replace('torch.', '')}{kind}")


def init_single_rank() -> None:
    """A 1-rank process group and megatron-core's parallel state (idempotent)."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)


def build(shape: Shape, setting: str, dropout: float = 0.0):
    """A TransformerBlock (no final norm) with this setting's config."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    flags, upstream = SETTINGS[setting]
    extra = {}
    if shape.experts:
        extra = dict(num_moe_experts=shape.experts, moe_router_topk=2,
                     moe_ffn_hidden_size=shape.ffn, moe_token_dispatcher_type="alltoall",
                     moe_aux_loss_coeff=0.0)
        if shape.shared_expert:
            extra["moe_shared_expert_intermediate_size"] = shape.shared_expert
            extra["moe_shared_expert_overlap"] = shape.shared_overlap
        extra["moe_grouped_gemm"] = shape.grouped
    torch.manual_seed(1234)
    config = TransformerConfig(
        num_layers=shape.layers, hidden_size=shape.hidden, ffn_hidden_size=shape.ffn,
        num_attention_heads=shape.heads, num_query_groups=shape.query_groups,
        gated_linear_unit=shape.swiglu,
        activation_func=torch.nn.functional.silu if shape.swiglu else torch.nn.functional.gelu,
        normalization="RMSNorm", add_bias_linear=False,
        hidden_dropout=dropout, attention_dropout=dropout,
        use_cpu_initialization=True, params_dtype=shape.dtype, bf16=shape.dtype == torch.bfloat16,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, bias_activation_fusion=False,
        persist_layer_norm=False, **extra, **upstream)
    for name in FLAGS:
        setattr(config, name, name in flags)
    spec = get_gpt_layer_local_spec(num_experts=shape.experts or None, normalization="RMSNorm",
                                    moe_grouped_gemm=shape.grouped)
    block = TransformerBlock(config, spec, post_layer_norm=False).to("cuda")
    return block


def inputs(shape: Shape):
    """(hidden states, causal mask, RoPE table): the layer input and two tensors every layer
    shares (left out of per-layer counts)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape.seq, shape.batch, shape.hidden, generator=gen).to(shape.dtype)
    x = x.to("cuda").requires_grad_()
    mask = torch.ones(1, 1, shape.seq, shape.seq, dtype=torch.bool).triu(1).to("cuda")
    rope = RotaryEmbedding(kv_channels=shape.hidden // shape.heads, rotary_percent=1.0)(shape.seq)
    return x, mask, rope.to("cuda")


def block_bytes(shape: Shape, setting: str) -> Dict[str, int]:
    """Bytes held for backward by the first layer's attention block and MLP block, each run
    on its own (fresh input), and per layer by the whole block of layers."""
    block = build(shape, setting)
    block.train()
    params = list(block.parameters())
    x, mask, rope = inputs(shape)
    layer = block.layers[0]
    out = {}
    with SavedBytes(exclude=[*params, mask, rope]) as saved:
        h, _ = layer._forward_attention(x, attention_mask=mask, rotary_pos_emb=rope)
    out["attention"] = saved.nbytes()
    out["attention_widths"] = sorted({t.shape[-1] for t in saved.tensors() if t.dim()})
    h.sum().backward()
    h2 = h.detach().requires_grad_()
    with SavedBytes(exclude=[*params, mask, rope]) as saved:
        y = layer._forward_mlp(h2)
    out["mlp"] = saved.nbytes()
    out["mlp_widths"] = sorted({t.shape[-1] for t in saved.tensors() if t.dim()})
    y.sum().backward()
    if shape.experts:
        out.update(moe_bytes(layer, h.detach().requires_grad_(), [*params, mask, rope]))
    with SavedBytes(exclude=[*params, mask, rope]) as saved:
        z = block(x, mask, rotary_pos_emb=rope)
    out["per_layer"] = saved.nbytes() // shape.layers
    z.sum().backward()
    out["input"] = x.numel() * x.element_size()
    return out


def moe_bytes(layer, h, exclude) -> Dict[str, int]:
    """Bytes held by the MoE layer's experts and shared experts themselves (saved while they
    run), and the bytes of the experts' inputs (the dispatched tokens and their probabilities)."""
    counters, inputs_seen = {}, {}

    def pre(name):
        def hook(module, args):
            if name == "experts":
                inputs_seen[name] = sum(a.numel() * a.element_size() for a in args
                                        if isinstance(a, torch.Tensor))
            counters[name] = SavedBytes(exclude=exclude).__enter__()
        return hook

    def post(name):
        def hook(module, args, output):
            counters[name].__exit__(None, None, None)
        return hook

    handles = []
    for name in ("experts", "shared_experts"):
        module = getattr(layer.mlp, name, None)
        if module is not None:
            handles += [module.register_forward_pre_hook(pre(name)),
                        module.register_forward_hook(post(name))]
    try:
        y = layer._forward_mlp(h)
    finally:
        for handle in handles:
            handle.remove()
    found = {f"{name}_held": c.nbytes() for name, c in counters.items()}
    found["experts_inputs"] = inputs_seen.get("experts", 0)
    y.sum().backward()
    return found
