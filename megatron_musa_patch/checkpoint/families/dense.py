"""Dense decoder families: Llama 2/3 (GQA, Llama 3.1's RoPE scaling), Mistral (no sliding
window), Qwen2/2.5 (QKV bias), Qwen3 (per-head RMSNorm of queries and keys).

They share one layout: RMSNorm, RoPE, SwiGLU MLP, no bias except Qwen2's on Q, K and V. On the
Megatron side that is the local spec's GPT layer (``--transformer-impl local``)."""

from __future__ import annotations

from .common import (ATTENTION, DECODER_FIELDS, QK_NORM, QKV_BIAS, QWEN_WINDOW, no_sliding_window,
                     only_full_attention, swiglu)
from .fields import fixed
from .table import LOCAL_SPEC, Family, Section

MLP = swiglu("mlp.", "mlp.")
NO_OUTPUT_BIAS = fixed("attention_bias", (None, False),
                       "Megatron's --add-qkv-bias covers Q, K and V, not the output projection",
                       False)


def _args_are(qkv_bias: bool, qk_norm: bool):
    def test(args) -> bool:
        return (not getattr(args, "num_experts", None)
                and not getattr(args, "multi_latent_attention", False)
                and bool(getattr(args, "add_qkv_bias", False)) == qkv_bias
                and bool(getattr(args, "qk_layernorm", False)) == qk_norm)
    return test


LLAMA = Family(
    "llama", "LlamaForCausalLM",
    fields=DECODER_FIELDS + (
        NO_OUTPUT_BIAS,
        fixed("mlp_bias", (None, False), "no MLP bias in the local spec's SwiGLU", False),
        fixed("pretraining_tp", (None, 1), "a sharded pretraining layout")),
    layer=(Section(ATTENTION + MLP),),
    made_from_args=_args_are(qkv_bias=False, qk_norm=False))

MISTRAL = Family("mistral", "MistralForCausalLM",
                 fields=DECODER_FIELDS + (no_sliding_window(),),
                 layer=(Section(ATTENTION + MLP),))

QWEN2 = Family(
    "qwen2", "Qwen2ForCausalLM",
    fields=DECODER_FIELDS + QWEN_WINDOW,
    always=LOCAL_SPEC + ("--add-qkv-bias",),
    layer=(Section(ATTENTION + QKV_BIAS + MLP),),
    checks=(only_full_attention,),
    made_from_args=_args_are(qkv_bias=True, qk_norm=False))

QWEN3 = Family(
    "qwen3", "Qwen3ForCausalLM",
    fields=DECODER_FIELDS + QWEN_WINDOW + (NO_OUTPUT_BIAS,),
    always=LOCAL_SPEC + ("--qk-layernorm",),
    layer=(Section(ATTENTION + QK_NORM + MLP),),
    checks=(only_full_attention,),
    made_from_args=_args_are(qkv_bias=False, qk_norm=True))

FAMILIES = (LLAMA, MISTRAL, QWEN2, QWEN3)
