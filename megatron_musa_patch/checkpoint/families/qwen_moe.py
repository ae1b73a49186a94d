"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) and Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the
dense Qwen attention (Q, K, V biases for Qwen2, per-head query/key norms for Qwen3) with a top-k
mixture of SwiGLU experts, and, for Qwen2-MoE, a shared expert scaled by a sigmoid gate
(Megatron's ``--moe-shared-expert-gate``; the layer adds the flag where a release lacks it).

The router takes a softmax over every expert and keeps the top k: renormalised
(``norm_topk_prob``, Megatron's default top-k of the logits then a softmax over those) or not
(``--moe-router-pre-softmax``). Layers listed in ``mlp_only_layers`` or off the
``decoder_sparse_step`` are dense (``intermediate_size``), as ``--moe-layer-freq`` says."""

from __future__ import annotations

from typing import List

from .common import (ATTENTION, DECODER_FIELDS, EXPERTS, QK_NORM, QKV_BIAS, QWEN_WINDOW, ROUTER,
                     aux_loss_coeff, aux_loss_flags, only_full_attention, routed_by_softmax,
                     swiglu)
from .fields import Field, fixed, sized
from .rows import Rename
from .table import LOCAL_SPEC, Family, Section


def experts(config: dict) -> int:
    """The routed experts, in either spelling (the hub's ``num_experts``, transformers 5's
    ``num_local_experts`` for Qwen3-MoE)."""
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def moe_layer(config: dict, i: int) -> bool:
    step = int(config.get("decoder_sparse_step") or 1)
    return i not in (config.get("mlp_only_layers") or []) and (i + 1) % step == 0


def dense_layer(config: dict, i: int) -> bool:
    return not moe_layer(config, i)


def _layer_freq(config: dict) -> List[str]:
    pattern = [int(moe_layer(config, i)) for i in range(int(config["num_hidden_layers"]))]
    if all(pattern):
        return []
    return ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]  # one word


def _pattern(args) -> List[int]:
    freq = args.moe_layer_freq
    if isinstance(freq, (list, tuple)):
        return [int(f) for f in freq]
    return [int(i % int(freq) == 0) for i in range(args.num_layers)]




#: the fields both model types share (besides the decoder's)
MOE_FIELDS = (
    Field("num_experts", lambda c: ["--num-experts", str(experts(c)), "--moe-router-dtype", "fp32"],
          lambda a: a.num_experts),
    sized("num_experts_per_tok", "--moe-router-topk", "moe_router_topk"),
    sized("moe_intermediate_size", "--moe-ffn-hidden-size", "moe_ffn_hidden_size"),
    Field("norm_topk_prob", lambda c: [] if c.get("norm_topk_prob") else
          ["--moe-router-pre-softmax"], lambda a: not getattr(a, "moe_router_pre_softmax", False)),
    Field("router_aux_loss_coef", aux_loss_flags, aux_loss_coeff),
    Field("decoder_sparse_step", _layer_freq, lambda a: 1),
    Field("mlp_only_layers", from_args=lambda a: [i for i, f in enumerate(_pattern(a)) if not f]),
    *QWEN_WINDOW,
)


def _args_are(qkv_bias: bool, qk_norm: bool, shared: bool):
    """A checkpoint of this type: its experts softmax-routed, unscaled, and (Qwen2-MoE) a
    gated shared expert."""
    def test(args) -> bool:
        return (bool(getattr(args, "num_experts", None)) and routed_by_softmax(args)
                and not getattr(args, "multi_latent_attention", False)
                and bool(getattr(args, "add_qkv_bias", False)) == qkv_bias
                and bool(getattr(args, "qk_layernorm", False)) == qk_norm
                and bool(getattr(args, "moe_shared_expert_intermediate_size", None)) == shared
                and bool(getattr(args, "moe_shared_expert_gate", False)) == shared)
    return test


QWEN3_MOE = Family(
    "qwen3_moe", "Qwen3MoeForCausalLM",
    fields=DECODER_FIELDS + MOE_FIELDS + (
        Field("num_local_experts"),  # transformers 5's spelling of num_experts
        fixed("attention_bias", (None, False), "Qwen3-MoE's attention has no biases", False)),
    always=LOCAL_SPEC + ("--qk-layernorm",),
    layer=(Section(ATTENTION + QK_NORM),
           Section(swiglu("mlp.", "mlp."), where=dense_layer),
           Section(ROUTER, where=moe_layer),
           Section(swiglu("", ""), where=moe_layer, experts=EXPERTS)),
    checks=(only_full_attention,),
    experts=experts,
    made_from_args=_args_are(qkv_bias=False, qk_norm=True, shared=False))

SHARED = "mlp.shared_experts."
QWEN2_MOE = Family(
    "qwen2_moe", "Qwen2MoeForCausalLM",
    fields=DECODER_FIELDS + MOE_FIELDS + (
        fixed("qkv_bias", (None, True), "Qwen2-MoE's attention has Q, K and V biases", True),
        Field("shared_expert_intermediate_size",
              lambda c: ["--moe-shared-expert-intermediate-size",
                         str(int(c["shared_expert_intermediate_size"])),
                         "--moe-shared-expert-gate"],
              lambda a: a.moe_shared_expert_intermediate_size,
              allowed=lambda v: v is not None and int(v) > 0,
              why="Qwen2-MoE has a shared expert (a positive size)")),
    always=LOCAL_SPEC + ("--add-qkv-bias",),
    layer=(Section(ATTENTION + QKV_BIAS),
           Section(swiglu("mlp.", "mlp."), where=dense_layer),
           Section(ROUTER + swiglu(SHARED, "mlp.shared_expert.") + (
               Rename(SHARED + "gate_weight", "mlp.shared_expert_gate.weight"),),
               where=moe_layer),
           Section(swiglu("", ""), where=moe_layer, experts=EXPERTS)),
    checks=(only_full_attention,),
    experts=experts,
    made_from_args=_args_are(qkv_bias=True, qk_norm=False, shared=True))

FAMILIES = (QWEN3_MOE, QWEN2_MOE)
