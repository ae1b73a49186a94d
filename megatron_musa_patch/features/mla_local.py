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
``isinstance(..., TELinear)`` with ``TELinear = None``: without TE the flag is set False.
"""

from __future__ import annotations

import math

from ..binding import call_arguments
from ..compat.facts import fixed_upstream
from ..conditions import te_missing
from ..flag_needs import FlagNeed
from ..hookspecs import hookimpl
from ..registry import Patch

FEATURE = "mla_local"
REQUIRED = False
DESCRIPTION = "--multi-latent-attention with the local (no TransformerEngine) attention"

FLAG_NEEDS = (FlagNeed("--multi-latent-attention",
                       when=lambda args: getattr(args, "multi_latent_attention", False)
                       and getattr(args, "transformer_impl", "local") == "local",
                       because="on the local spec upstream's MLA passes arguments the local "
                               "attention does not take"),)


@hookimpl
def mmp_register_patches(registry):
    registry.add(Patch(
        "mla_local.dot_product_attention_channels",
        "megatron.core.transformer.dot_product_attention:DotProductAttention.__init__", "wrap",
        _accept_k_v_channels, FEATURE,
        why="MLA passes k_channels/v_channels: set the output width and default scale from them"))
    until, outside = fixed_upstream("mla_knows_te_is_missing")
    registry.add(Patch(
        "mla_local.have_te", "megatron.core.transformer.multi_latent_attention:HAVE_TE",
        "attribute", False, FEATURE, condition=te_missing, megatron=until, outside=outside,
        why="its TE names are None without TE; the module believed TE was there"))


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
