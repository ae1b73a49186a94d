"""Multi-latent attention (MLA) on the local layer spec (no TransformerEngine).

Upstream's ``MLASelfAttention`` builds its core attention with ``k_channels`` (the query/key head
dim, ``qk_head_dim + qk_pos_emb_head_dim``) and ``v_channels`` (``v_head_dim``), which only
TransformerEngine's attention accepts; the local ``DotProductAttention`` takes neither, so every
``--multi-latent-attention`` run without TE fails at model construction. The local attention
already computes with whatever head sizes its inputs have; only its output width
(``hidden_size_per_partition``) and default softmax scale come from ``kv_channels``. This feature
accepts the two arguments and sets exactly those.

``multi_latent_attention`` also sets ``HAVE_TE = True`` whenever megatron-core's TE extension
module imports, which it does without TE (its classes are then None), and then calls
``isinstance(..., TELinear)`` with ``TELinear = None``: without TE the flag is set False (before
0.17, which reads TE's own flag).

From 0.19, ``--qk-layernorm`` without a query LoRA (``--q-lora-rank`` unset, as in
DeepSeek-V2-Lite) normalises the query projection's input with a fused norm+linear, which only
TransformerEngine provides (``LayerNormColumnParallelLinear``): the local spec fails ("qk_layernorm
requires TransformerEngine"), and it also passes a standalone Q norm the Q/KV norm resolver
refuses. The local backend gets the same module made of a norm and megatron-core's
``ColumnParallelLinear`` (parameters named as TE names them, ``layer_norm_weight``), and the
resolver is handed the empty Q-norm slot TE's spec gives it: the same model as with TE.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from megatron_musa_patch.upstream.binding import call_arguments, has_parameter
from megatron_musa_patch.upstream.conditions import te_missing
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.facts import fixed_upstream
from megatron_musa_patch.core.feature import feature


FEATURE = feature(
    __name__,
    "--multi-latent-attention with the local (no TransformerEngine) attention",
    flag_needs=(FlagNeed("--multi-latent-attention",
                           when=lambda args: getattr(args, "multi_latent_attention", False)
                           and getattr(args, "transformer_impl", "local") == "local",
                           because="on the local spec upstream's MLA passes arguments the local "
                                   "attention does not take"),),
    aliases=("mla_local",))


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "dot_product_attention_channels",
        "megatron.core.transformer.dot_product_attention:DotProductAttention.__init__", "wrap",
        _accept_k_v_channels,
        why="MLA passes k_channels/v_channels: set the output width and default scale from them"))
    until, ends = fixed_upstream("mla_knows_te_is_missing", since="0.16.1")
    registry.add(FEATURE.patch(
        "have_te", "megatron.core.transformer.multi_latent_attention:HAVE_TE",
        "attribute", False, condition=te_missing, megatron=until, ends=ends,
        why="its TE names are None without TE; the module believed TE was there"))
    registry.extend(_norm_linear_records())


def _norm_linear_records():
    return [FEATURE.patch(
        "fused_q_norm",
        "megatron.core.transformer.mla_qk_norm_config:QKNormConfigResolver.__init__", "wrap",
        _with_local_fused_q_norm, megatron=">=0.19",
        starts="the Q/KV norm resolver exists from 0.19",
        why="MLA without a query LoRA: the query projection's fused norm, built from "
            "megatron-core's own layers where TE's is missing (as TE's spec resolves it)")]


@functools.lru_cache(maxsize=None)
def norm_linear_class():
    """megatron-core's ColumnParallelLinear after a norm of its input: TE's
    LayerNormColumnParallelLinear for the local backend."""
    import torch
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    from megatron_musa_patch.lib.ops import norm

    class LayerNormColumnParallelLinear(ColumnParallelLinear):
        def __init__(self, input_size, output_size, *, config, **kwargs):
            accepted = {k: v for k, v in kwargs.items()
                        if has_parameter(ColumnParallelLinear.__init__, k)}
            super().__init__(input_size, output_size, config=config, **accepted)
            self.normalization = config.normalization
            self.eps = config.layernorm_epsilon
            self.zero_centered_gamma = bool(getattr(config, "layernorm_zero_centered_gamma",
                                                    False))
            dtype = config.params_dtype
            self.layer_norm_weight = torch.nn.Parameter(
                torch.zeros(input_size, dtype=dtype) if self.zero_centered_gamma
                else torch.ones(input_size, dtype=dtype))
            self.layer_norm_bias = torch.nn.Parameter(torch.zeros(input_size, dtype=dtype)) \
                if self.normalization == "LayerNorm" else None
            for param in (self.layer_norm_weight, self.layer_norm_bias):
                if param is not None:  # replicated across TP: reduced like TE's norm weights
                    setattr(param, "sequence_parallel", bool(config.sequence_parallel))

        def forward(self, input_, *args, **kwargs):
            weight = self.layer_norm_weight + 1 if self.zero_centered_gamma \
                else self.layer_norm_weight
            if self.normalization == "RMSNorm":
                normed = norm.rms_norm(input_, weight, self.eps)
            else:
                normed = norm.layer_norm(input_, weight, self.layer_norm_bias, self.eps)
            return super().forward(normed, *args, **kwargs)

    return LayerNormColumnParallelLinear


def _with_local_fused_q_norm(wrapped, instance, args, kwargs):
    """The resolver of one MLA layer: without a query LoRA the local spec's standalone Q norm
    (which the resolver refuses) is left out, and the fused norm+linear it then asks the backend
    for is ours when the backend has none. Other layers and specs are not touched."""
    call = call_arguments(wrapped, args, kwargs)
    config, submodules = call["config"], call["submodules"]
    from megatron.core.transformer.identity_op import IdentityOp

    no_q_lora = config.q_lora_rank is None
    norm_slot = getattr(submodules, "q_layernorm", None)
    if no_q_lora and norm_slot not in (None, IdentityOp) and dataclasses.is_dataclass(submodules):
        call["submodules"] = dataclasses.replace(submodules, q_layernorm=IdentityOp)
    wrapped(**call)
    if no_q_lora and config.qk_layernorm and instance.fused_norm_linear_impl is None:
        instance.fused_norm_linear_impl = norm_linear_class()


def _accept_k_v_channels(wrapped, instance, args, kwargs):
    k_channels = kwargs.pop("k_channels", None)
    v_channels = kwargs.pop("v_channels", None)
    wrapped(*args, **kwargs)
    if k_channels is None and v_channels is None:
        return
    call = call_arguments(wrapped, args, kwargs, defaults=False)
    heads = instance.num_attention_heads_per_partition
    if v_channels is not None:
        instance.hidden_size_per_partition = v_channels * heads
    if k_channels is not None:
        instance.hidden_size_per_attention_head = k_channels
        if call.get("softmax_scale") is None:
            # upstream's default, 1/sqrt(head dim), with the key's head dim
            instance.softmax_scale = 1.0 / math.sqrt(k_channels)
            if instance.config.apply_query_key_layer_scaling:
                instance.softmax_scale /= instance.layer_number
