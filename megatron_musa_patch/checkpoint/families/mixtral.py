"""Mixtral: the dense family's attention with a top-k mixture of SwiGLU experts.

Hugging Face's router takes a softmax over every expert, keeps the top k and renormalises them;
Megatron's default router (top-k of the logits, then a softmax over those) gives the same
weights. Megatron's local spec holds the experts as ``mlp.experts.local_experts.<e>``."""

from __future__ import annotations

from .common import (ATTENTION, DECODER_FIELDS, aux_loss_coeff, aux_loss_flags,
                     no_sliding_window, routed_by_softmax, swiglu)
from .fields import Field, fixed, sized
from .rows import Rename
from .table import Family, Section

EXPERTS = ("mlp.experts.local_experts.{e}.", "block_sparse_moe.experts.{e}.")


def _experts(config: dict) -> int:
    return int(config["num_local_experts"])


def routed_by_top_k(args) -> bool:
    """A checkpoint of a MoE model with a Llama-like attention and neither shared experts nor
    query/key norms or biases."""
    return (bool(getattr(args, "num_experts", None)) and routed_by_softmax(args)
            and not getattr(args, "multi_latent_attention", False)
            and not getattr(args, "qk_layernorm", False)
            and not getattr(args, "add_qkv_bias", False)
            and not getattr(args, "moe_shared_expert_intermediate_size", None))


MIXTRAL = Family(
    "mixtral", "MixtralForCausalLM",
    fields=DECODER_FIELDS + (
        no_sliding_window(),
        sized("num_local_experts", "--num-experts", "num_experts"),
        sized("num_experts_per_tok", "--moe-router-topk", "moe_router_topk"),
        Field("router_aux_loss_coef", aux_loss_flags, aux_loss_coeff),
        fixed("router_jitter_noise", (None, 0, 0.0), "Megatron's router has no jitter noise",
              0.0)),
    layer=(Section(ATTENTION + (Rename("mlp.router.weight", "block_sparse_moe.gate.weight"),)),
           Section(swiglu("", "", "w1", "w3", "w2"), experts=EXPERTS)),
    experts=_experts,
    made_from_args=routed_by_top_k)

FAMILIES = (MIXTRAL,)
