"""``--rope-fusion`` (default on with RoPE) without TransformerEngine: megatron-core's
``fused_apply_rotary_pos_emb[_thd]`` slots (TransformerEngine's) get ``ops.rope``, and
``apply_rotary_pos_emb`` routes fused calls to it with the full unfused semantics (interleaved,
MLA channel order, ``mscale``, thd offsets). Upstream asserts/raises without TE. Multi-latent
attention (whose fused RoPE is a triton kernel for CUDA) takes upstream's unfused RoPE path off
CUDA instead of failing."""

from __future__ import annotations

import functools
import logging
import sys

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import te_installed, te_missing
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import OFF_CUDA


ROPE = "megatron.core.models.common.embeddings.rope_utils"
CONFIG = "megatron.core.transformer.transformer_config"
SLOTS = ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd")


def _uses_rope(args) -> bool:
    return (getattr(args, "position_embedding_type", None) == "rope"
            or getattr(args, "use_rotary_position_embeddings", False)
            or getattr(args, "multi_latent_attention", False))


FEATURE = feature(
    __name__,
    "--rope-fusion without TransformerEngine (ops.rope)",
    flag_needs=(FlagNeed(
        "--rope-fusion",
        when=lambda args: getattr(args, "apply_rope_fusion", False) and _uses_rope(args)
        and not te_installed(),
        because="on by default with RoPE; upstream needs TransformerEngine for it",
        instead="add --no-rope-fusion"),))


@hookimpl
def mmp_register_patches(session, registry):
    for slot in SLOTS:
        registry.add(FEATURE.patch(
            slot, f"{ROPE}:{slot}", "attribute", _slot(slot),
            condition=lambda s=slot: _slot_empty(s),
            why="--rope-fusion without TransformerEngine: ops.rope"))
    registry.add(
        FEATURE.patch(
            "apply_rotary_pos_emb",
            f"{ROPE}:apply_rotary_pos_emb",
            "wrap",
            _apply_rope,
            condition=te_missing,
            why="--rope-fusion: ops.rope with the unfused path's semantics (interleaved, thd, MLA)",
        )
    )
    registry.add(FEATURE.patch(
        "config_check", f"{CONFIG}:TransformerConfig.__post_init__", "wrap",
        _config_with_our_rope, condition=te_missing,
        why="--rope-fusion --rotary-interleaved: ops.rope handles it (upstream asks for TE 2.3)"))
    registry.add(FEATURE.patch(
        "mla_unfused", f"{CONFIG}:MLATransformerConfig.__post_init__", "wrap",
        functools.partial(_mla_without_fused_rope, session.state_for(FEATURE.name, set)),
        devices=OFF_CUDA,
        why="--rope-fusion with MLA needs triton on CUDA: MLA takes the unfused RoPE path here"))


def _slot(slot):
    from megatron_musa_patch.lib.ops import rope

    return getattr(rope, slot)


def _slot_empty(slot):
    module = sys.modules.get(ROPE)
    if module is not None and getattr(module, slot, None) is not None:
        return "TransformerEngine fills it"
    return True


def _ours_in_slot() -> bool:
    from megatron_musa_patch.lib.ops import rope

    module = sys.modules.get(ROPE)
    return module is not None and getattr(module, "fused_apply_rotary_pos_emb", None) is \
        rope.fused_apply_rotary_pos_emb


def _apply_rope(wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    t, freqs, config = call["t"], call["freqs"], call["config"]
    mrope = getattr(config, "mrope_section", None) is not None
    if not (config.apply_rope_fusion and _ours_in_slot()) or mrope:
        return wrapped(*args, **kwargs)
    from megatron_musa_patch.lib.ops import rope

    # the MLA channel order: from 0.19 the caller says (mla_rotary_interleaved), before it the
    # config does (and 0.19 itself falls back to it when the caller passes None)
    mla = call.get("mla_rotary_interleaved")
    if mla is None:
        mla = bool(getattr(config, "multi_latent_attention", False))
    mscale, cu_seqlens, cp_group = call["mscale"], call["cu_seqlens"], call.get("cp_group")
    if cu_seqlens is None:
        return rope.apply_rope_bshd(t, freqs, config.rotary_interleaved, mla, mscale)
    if cp_group is None:
        from megatron.core import parallel_state

        cp_group = parallel_state.get_context_parallel_group()
    return rope.apply_rope_thd(t, cu_seqlens, freqs, config.rotary_interleaved, mla, mscale,
                               cp_group.size(), cp_group.rank())


def _config_with_our_rope(wrapped, instance, args, kwargs):
    """Upstream's __post_init__ demands TE >= 2.3 for fused interleaved RoPE; ops.rope does it:
    skip only that check (the rest of __post_init__ runs unchanged)."""
    skip = (_ours_in_slot() and getattr(instance, "apply_rope_fusion", False)
            and getattr(instance, "rotary_interleaved", False)
            and not getattr(instance, "multi_latent_attention", False))
    if not skip:
        return wrapped(*args, **kwargs)
    instance.apply_rope_fusion = False
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.apply_rope_fusion = True


def _mla_without_fused_rope(said, wrapped, instance, args, kwargs):
    """MLA's fused RoPE (``fused_mla_yarn_rope_apply``) is a triton kernel for CUDA; off CUDA the
    default --rope-fusion would fail in the first forward (or, for rope_type 'rope', in this
    __post_init__). MLA then takes upstream's unfused RoPE path: the same numbers. ``said``:
    the session's record of the note already logged."""
    if getattr(instance, "apply_rope_fusion", False):
        instance.apply_rope_fusion = False
        if "mla" not in said:
            said.add("mla")
            logging.getLogger("megatron_musa_patch").info(
                "megatron_musa_patch: multi-latent attention uses the unfused RoPE path (its "
                "fused kernel is triton on CUDA); --no-rope-fusion is not needed")
    return wrapped(*args, **kwargs)
