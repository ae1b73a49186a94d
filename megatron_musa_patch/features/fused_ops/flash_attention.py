"""``--use-flash-attn`` on the local layer spec: core attention through SDPA.

Upstream (megatron-core / Megatron-LM core_v0.16.1) reads ``args.use_flash_attn`` only in the
legacy model (``megatron/legacy/model/transformer.py``, which needs the ``flash_attn`` package)
and in one ``--deterministic-mode`` assertion; ``core_transformer_config_from_args`` does not
carry it and megatron-core's local ``DotProductAttention`` always computes attention unfused
(baddbmm, masked softmax, bmm). So on ``--transformer-impl local`` the flag is accepted and
silently ignored. With this feature the flag routes the local ``DotProductAttention.forward``
through ``ops.attention.sdpa_attention`` (flash kernels on CUDA/MUSA, the CPU flash kernel on
CPU), with upstream's semantics: the given mask (True = masked) or the layer's causal mask,
sliding-window layers, GQA, MLA's differing key/value head sizes, the softmax scale including
``apply_query_key_layer_scaling``'s coefficient, and attention dropout drawn inside the RNG
tracker's ``fork()`` (on CPU SDPA's dropout draws from the host generator, which the CPU row's
tracker forks as well; its dropout pattern differs from ``nn.Dropout``'s).

Carried onto the TransformerConfig as ``config.use_flash_attn`` (megatron-core users set it).
On CPU, 16-bit attention over fewer than ``ops.attention.CPU_16BIT_MIN_POSITIONS`` query x key
positions keeps upstream's unfused path, which measured as fast or faster there (same math).
Cases SDPA cannot express fall back to upstream's unfused code, with one warning per case:
``--softmax-type off-by-one|learnable`` (a softmax offset). Packed sequences (thd) and attention
bias are not supported by the local attention upstream either; those calls go to upstream,
which raises its own error.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature


logger = logging.getLogger("megatron_musa_patch")
#: printed once per run on rank 0 when the SDPA path first runs
ANNOUNCEMENT = ("megatron_musa_patch: --use-flash-attn: core attention runs through "
                "scaled_dot_product_attention")

FEATURE = feature(
    __name__,
    "--use-flash-attn on the local spec: core attention through SDPA",
    flag_needs=(FlagNeed(
        "--use-flash-attn",
        when=lambda args: getattr(args, "use_flash_attn", False)
        and not getattr(args, "use_legacy_models", False)
        and getattr(args, "transformer_impl", "local") == "local",
        because="with --transformer-impl local: upstream's local attention has no flash path and "
                "would ignore the flag"),),
    aliases=("flash_attention",), kept_out=("fused_ops",))


@dataclasses.dataclass
class _Said:
    """What this run already told the user."""

    fallbacks: set = dataclasses.field(default_factory=set)
    announced: bool = False


@hookimpl
def mmp_register_patches(session, registry):
    said = session.state_for(FEATURE.name, _Said)
    registry.add(FEATURE.patch(
        "core_attention",
        "megatron.core.transformer.dot_product_attention:DotProductAttention.forward", "wrap",
        functools.partial(_forward, said, session.is_rank_zero()),
        why="--use-flash-attn: local core attention through scaled_dot_product_attention"))


@hookimpl
def mmp_transformer_config(args, config):
    config.use_flash_attn = bool(getattr(args, "use_flash_attn", False)) and not getattr(
        args, "use_legacy_models", False)


def _fallback(said: _Said, reason: str) -> None:
    if reason not in said.fallbacks:
        said.fallbacks.add(reason)
        logger.warning("megatron_musa_patch: --use-flash-attn: %s; this attention runs "
                       "upstream's unfused code", reason)


def _forward(said, rank_zero, wrapped, instance, args, kwargs):
    if not getattr(instance.config, "use_flash_attn", False):
        return wrapped(*args, **kwargs)
    call = call_arguments(wrapped, args, kwargs)
    if call.get("attention_bias") is not None or call.get("packed_seq_params") is not None:
        return wrapped(*args, **kwargs)  # unsupported upstream too: its assertion explains
    if getattr(instance, "softmax_offset", None) is not None:
        _fallback(said, f"--softmax-type {instance.config.softmax_type} (a softmax offset)")
        return wrapped(*args, **kwargs)
    from megatron_musa_patch.lib.ops.attention import sdpa_preferred

    query, key = call["query"], call["key"]
    if not sdpa_preferred(query.device.type, query.dtype, query.shape[0], key.shape[0]):
        return wrapped(*args, **kwargs)  # measured faster on this device for this size
    if not said.announced:
        said.announced = True
        if rank_zero:
            print(ANNOUNCEMENT, flush=True)
    return run_core_attention(instance, call["query"], call["key"], call["value"],
                              call.get("attention_mask"))


def run_core_attention(instance, query, key, value, attention_mask):
    """SDPA with the settings of one upstream ``DotProductAttention`` module."""
    from megatron.core import tensor_parallel
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_musa_patch.lib.ops.attention import sdpa_attention, sliding_window_mask

    softmax = instance.scale_mask_softmax
    # upstream divides the QK^T scale by the layer-scaling coefficient and multiplies the
    # scores by it again inside the softmax
    scale = instance.softmax_scale * (softmax.scale if softmax.scale is not None else 1.0)
    sq, sk = query.shape[0], key.shape[0]
    mask = attention_mask
    causal = instance.attn_mask_type == AttnMaskType.causal
    if softmax.window_size is not None:
        mask = sliding_window_mask(sq, sk, softmax.window_size, query.device)
    elif causal and mask is None and sq > 1 and sq != sk:
        raise AssertionError("causal mask is only for self attention")  # upstream's check
    dropout = instance.attention_dropout.p if instance.training else 0.0

    def attend():
        return sdpa_attention(query, key, value, mask=mask, causal=causal, scale=scale,
                              dropout_p=dropout)

    if dropout and not instance.config.sequence_parallel:
        with tensor_parallel.get_cuda_rng_tracker().fork():
            return attend()
    return attend()
