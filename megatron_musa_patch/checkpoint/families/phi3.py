"""Phi-3 and Phi-4 (``Phi3ForCausalLM``): a Llama-like decoder whose checkpoint holds Q, K and V
in one ``qkv_proj`` (all queries, then keys, then values) and the MLP's gate and up in one
``gate_up_proj`` (gate first, as Megatron's fused fc1 has them). Partial RoPE
(``partial_rotary_factor``) is Megatron's ``--rotary-percent``. Refused: LongRoPE (Phi-3's 128k
models, Phi-3.5, and Phi-4-mini, whose RoPE is both partial and LongRoPE) and a sliding window
shorter than the model's positions (Phi-3-mini-4k's 2047)."""

from __future__ import annotations

from ..errors import ConversionError
from .common import DECODER_FIELDS
from .fields import understood
from .rows import ROW, PackedGated, PackedQKV, Rename
from .table import Family, Section


def _window(config: dict) -> None:
    window = config.get("sliding_window")
    if window is not None and int(window) < int(config["max_position_embeddings"]):
        raise ConversionError(
            f"config.json: sliding_window={window} below max_position_embeddings="
            f"{config['max_position_embeddings']}: Megatron's local attention has no sliding "
            f"window, so tokens further apart than {window} would see each other. Nothing was "
            f"written.")


PHI3 = Family(
    "phi3", "Phi3ForCausalLM",
    fields=DECODER_FIELDS + tuple(understood(
        # dropout while training; the positions LongRoPE (refused) rescales from; the window,
        # checked with the positions; partial RoPE's older spelling
        "embd_pdrop", "resid_pdrop", "original_max_position_embeddings", "sliding_window",
        "partial_rotary_factor")),
    layer=(Section((
        Rename("input_layernorm.weight", "input_layernorm.weight"),
        PackedQKV("self_attention.linear_qkv.weight", "self_attn.qkv_proj.weight"),
        Rename("self_attention.linear_proj.weight", "self_attn.o_proj.weight", ROW),
        Rename("pre_mlp_layernorm.weight", "post_attention_layernorm.weight"),
        PackedGated("mlp.linear_fc1.weight", "mlp.gate_up_proj.weight"),
        Rename("mlp.linear_fc2.weight", "mlp.down_proj.weight", ROW))),),
    checks=(_window,))

FAMILIES = (PHI3,)
