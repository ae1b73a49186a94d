"""What the families share: the RoPE settings in either spelling, the attention's sizes, the
config fields and rows of a Llama-like decoder layer (RMSNorm, RoPE, grouped-query attention,
SwiGLU), which most tables start from."""

from __future__ import annotations

from typing import Dict, List

from ..errors import ConversionError
from .fields import Field, fixed, sized, understood
from .rows import ROW, Gated, GroupedQKV, Rename


def rope(config: dict) -> dict:
    """The RoPE settings, whichever spelling the config uses (transformers 5's
    ``rope_parameters``, or the older ``rope_theta`` with ``rope_scaling``)."""
    found = dict(config.get("rope_parameters") or {})
    if not found:
        found = dict(config.get("rope_scaling") or {})
        found["rope_theta"] = config.get("rope_theta", 10000.0)
    kind = found.get("rope_type", found.get("type", "default")) or "default"
    found["rope_type"] = kind
    return found


#: what Megatron's --use-rope-scaling implements (Llama 3.1's; only the factor is a flag)
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def rope_flags(config: dict) -> List[str]:
    settings = rope(config)
    flags = ["--position-embedding-type", "rope", "--rotary-base", number(settings["rope_theta"]),
             "--rotary-percent", repr(rotary_fraction(config))]
    if settings["rope_type"] == "default":
        return flags
    if settings["rope_type"] == "llama3":
        for name, expected in LLAMA3_FIXED.items():
            if float(settings.get(name, expected)) != expected:
                raise ConversionError(
                    f"config.json: rope scaling llama3 with {name}={settings.get(name)}: "
                    f"Megatron's --use-rope-scaling fixes it at {expected} (Llama 3.1's), so "
                    f"this model would get other rotary frequencies. Nothing was written.")
        return flags + ["--use-rope-scaling", "--rope-scaling-factor",
                        number(settings["factor"])]
    raise ConversionError(
        f"config.json: rope_type {settings['rope_type']!r} is not supported (default and "
        f"llama3 are); Megatron's local layers would compute other rotary frequencies. "
        f"Nothing was written.")


def rotary_fraction(config: dict) -> float:
    """The share of each head's channels RoPE rotates (the first ones, as Megatron's
    --rotary-percent rotates them)."""
    value = rope(config).get("partial_rotary_factor", config.get("partial_rotary_factor"))
    return float(1.0 if value is None else value)


def rope_from_args(args) -> dict:
    """``rope_parameters`` of a checkpoint's args (default RoPE, or Llama 3.1's scaling)."""
    found = {"rope_theta": float(args.rotary_base), "rope_type": "default"}
    if getattr(args, "use_rope_scaling", False):
        found = {**found, "rope_type": "llama3", "factor": float(args.rope_scaling_factor),
                 **LLAMA3_FIXED}
    if float(getattr(args, "rotary_percent", 1.0)) != 1.0:
        found["partial_rotary_factor"] = float(args.rotary_percent)
    return found


def aux_loss_coeff(args) -> float:
    """``--moe-aux-loss-coeff`` of a checkpoint's args: one value, or one per balancing type."""
    value = getattr(args, "moe_aux_loss_coeff", 0.0)
    value = value[0] if isinstance(value, (list, tuple)) else value
    return float(value or 0.0)


def number(value) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def dims(config: dict) -> Dict[str, int]:
    heads = int(config["num_attention_heads"])
    groups = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    if heads % groups:
        raise ConversionError(f"config.json: num_attention_heads={heads} is not a multiple of "
                              f"num_key_value_heads={groups}.")
    return {"heads": heads, "groups": groups, "head_dim": head_dim,
            "hidden": int(config["hidden_size"]), "layers": int(config["num_hidden_layers"])}


def arg(args, *names):
    """The first of ``names`` the checkpoint's args hold: a flag's attribute has been renamed
    across releases (``--norm-epsilon`` is ``layernorm_epsilon`` since the dataclass-made
    arguments)."""
    for name in names:
        if hasattr(args, name):
            return getattr(args, name)
    raise ConversionError(
        f"the checkpoint's args hold none of {', '.join(names)}: written by a Megatron release "
        f"this conversion does not know. Give the model's config with --hf-config.")


# ----------------------------------------------------------------------------- a Llama-like layer


def _norm_epsilon(args):
    return arg(args, "layernorm_epsilon", "norm_epsilon")


def _heads(config: dict) -> int:
    return int(config["num_attention_heads"])


#: the fields of a Llama-like decoder (``rope`` from any of its three spellings)
DECODER_FIELDS = (
    Field("vocab_size"),  # the vocabulary flags come from the tokenizer and the rows
    sized("num_hidden_layers", "--num-layers", "num_layers"),
    sized("hidden_size", "--hidden-size", "hidden_size"),
    sized("intermediate_size", "--ffn-hidden-size", "ffn_hidden_size"),
    sized("num_attention_heads", "--num-attention-heads", "num_attention_heads"),
    Field("num_key_value_heads",
          lambda c: ["--group-query-attention", "--num-query-groups",
                     str(int(c.get("num_key_value_heads") or _heads(c)))],
          lambda a: a.num_query_groups if a.group_query_attention else a.num_attention_heads),
    sized("head_dim", "--kv-channels", "kv_channels",
          default=lambda c: int(c["hidden_size"]) // _heads(c)),
    sized("max_position_embeddings", "--max-position-embeddings", "max_position_embeddings"),
    Field("rms_norm_eps", lambda c: ["--norm-epsilon", repr(float(c["rms_norm_eps"]))],
          _norm_epsilon),
    Field("tie_word_embeddings",
          lambda c: [] if c.get("tie_word_embeddings") else
          ["--untie-embeddings-and-output-weights"],
          lambda a: not a.untie_embeddings_and_output_weights),
    Field("attention_dropout",
          lambda c: ["--attention-dropout", repr(float(c.get("attention_dropout") or 0.0))],
          lambda a: a.attention_dropout),
    Field("rope_parameters", rope_flags, rope_from_args),
    *understood("rope_theta", "rope_scaling"),  # rope_parameters' older spelling
    fixed("hidden_act", ("silu",), "the SwiGLU of these families is silu-gated", "silu"),
)


def no_sliding_window(name: str = "sliding_window") -> Field:
    return fixed(name, (None,), "Megatron's local attention has no sliding window", None)


#: Qwen's sliding-window fields: the window off, its settings then read by nothing
QWEN_WINDOW = (fixed("use_sliding_window", (None, False),
                     "Megatron's local attention has no sliding window", False),
               *understood("sliding_window", "max_window_layers", "layer_types"))


def only_full_attention(config: dict) -> None:
    types = config.get("layer_types")
    if types and set(types) != {"full_attention"}:
        raise ConversionError(f"config.json: layer_types {sorted(set(types))}: only full "
                              f"attention layers are supported. Nothing was written.")


#: a Llama-like layer's norms and attention (Megatron's names, Hugging Face's), relative to
#: the layer
ATTENTION = (
    Rename("input_layernorm.weight", "input_layernorm.weight"),
    GroupedQKV("self_attention.linear_qkv.weight", "self_attn.q_proj.weight",
               "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    Rename("self_attention.linear_proj.weight", "self_attn.o_proj.weight", ROW),
    Rename("pre_mlp_layernorm.weight", "post_attention_layernorm.weight"),
)
QKV_BIAS = (GroupedQKV("self_attention.linear_qkv.bias", "self_attn.q_proj.bias",
                       "self_attn.k_proj.bias", "self_attn.v_proj.bias"),)
QK_NORM = (Rename("self_attention.q_layernorm.weight", "self_attn.q_norm.weight"),
           Rename("self_attention.k_layernorm.weight", "self_attn.k_norm.weight"))


def swiglu(megatron: str, hf: str, gate: str = "gate_proj", up: str = "up_proj",
           down: str = "down_proj"):
    """A SwiGLU MLP's rows under the prefixes ``megatron`` and ``hf``."""
    return (Gated(megatron + "linear_fc1.weight", f"{hf}{gate}.weight", f"{hf}{up}.weight"),
            Rename(megatron + "linear_fc2.weight", f"{hf}{down}.weight", ROW))


def routed_by_softmax(args) -> bool:
    """A checkpoint's MoE router scores experts by softmax, unscaled (Mixtral's and Qwen's)."""
    return (getattr(args, "moe_router_score_function", "softmax") == "softmax"
            and float(getattr(args, "moe_router_topk_scaling_factor", None) or 1.0) == 1.0
            and not getattr(args, "moe_router_num_groups", None))


def aux_loss_flags(config: dict) -> List[str]:
    """Megatron's auxiliary load-balancing loss at the config's ``router_aux_loss_coef``."""
    return ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff",
            repr(float(config.get("router_aux_loss_coef") or 0.0))]


#: a MoE layer's router, and the prefixes of its experts (Megatron's, Hugging Face's)
ROUTER = (Rename("mlp.router.weight", "mlp.gate.weight"),)
EXPERTS = ("mlp.experts.local_experts.{e}.", "mlp.experts.{e}.")
