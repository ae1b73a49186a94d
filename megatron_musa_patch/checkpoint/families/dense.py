"""Dense decoder families: Llama 2/3 (GQA, Llama 3.1's RoPE scaling), Mistral (no sliding
window), Qwen2/2.5 (QKV bias), Qwen3 (per-head RMSNorm of queries and keys).

They share one layout: RMSNorm, RoPE, SwiGLU MLP, no bias except Qwen2's on Q, K and V. On the
Megatron side that is the local spec's GPT layer (``--transformer-impl local``)."""

from __future__ import annotations

from typing import Callable, Iterator, List, Tuple

from ..errors import ConversionError
from . import common

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

#: fields each model type understands (besides common.BOOKKEEPING)
_BASE = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
         "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
         "rope_theta", "rope_scaling", "attention_dropout"}
FIELDS = {
    "llama": _BASE | {"attention_bias", "mlp_bias", "pretraining_tp"},
    "mistral": _BASE | {"sliding_window"},
    "qwen2": _BASE | {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"},
    "qwen3": _BASE | {"attention_bias", "use_sliding_window", "sliding_window",
                      "max_window_layers", "layer_types"},
}


def check(config: dict) -> None:
    kind = config["model_type"]
    common.check_fields(config, kind, FIELDS[kind])
    common.require(config, "hidden_act", ("silu",), "the SwiGLU of these families is silu-gated")
    common.require(config, "attention_bias", (None, False),
                   "Megatron's --add-qkv-bias covers Q, K and V, not the output projection")
    common.require(config, "mlp_bias", (None, False), "no MLP bias in the local spec's SwiGLU")
    common.require(config, "pretraining_tp", (None, 1), "a sharded pretraining layout")
    common.require(config, "use_sliding_window", (None, False),
                   "Megatron's local attention has no sliding window")
    if kind == "mistral":
        common.require(config, "sliding_window", (None,),
                       "Megatron's local attention has no sliding window")
    types = config.get("layer_types")
    if types and set(types) != {"full_attention"}:
        raise ConversionError(f"config.json: layer_types {sorted(set(types))}: only full "
                              f"attention layers are supported. Nothing was written.")


def flags(config: dict) -> List[str]:
    """The Megatron flags that build this architecture with the local spec."""
    d = common.dims(config)
    out = ["--transformer-impl", "local",
           "--num-layers", str(d["layers"]),
           "--hidden-size", str(d["hidden"]),
           "--ffn-hidden-size", str(int(config["intermediate_size"])),
           "--num-attention-heads", str(d["heads"]),
           "--group-query-attention", "--num-query-groups", str(d["groups"]),
           "--kv-channels", str(d["head_dim"]),
           "--max-position-embeddings", str(int(config["max_position_embeddings"])),
           "--normalization", "RMSNorm", "--norm-epsilon", repr(float(config["rms_norm_eps"])),
           "--swiglu", "--disable-bias-linear",
           "--hidden-dropout", "0.0",
           "--attention-dropout", repr(float(config.get("attention_dropout") or 0.0))]
    out += common.rope_flags(config)
    if not config.get("tie_word_embeddings", False):
        out.append("--untie-embeddings-and-output-weights")
    if config["model_type"] == "qwen2":
        out.append("--add-qkv-bias")
    if config["model_type"] == "qwen3":
        out.append("--qk-layernorm")
    return out


def layer_to_megatron(config: dict, i: int, get: Callable) -> Iterator[Tuple[str, object]]:
    """Megatron's tensors of decoder layer ``i`` (1-process layout), from ``get(hf_name)``."""
    yield from attention_to_megatron(config, i, get)
    yield from mlp_to_megatron(f"model.layers.{i}.mlp.", f"decoder.layers.{i}.mlp.", get)


def attention_to_megatron(config: dict, i: int, get: Callable):
    """The layer's norms and attention."""
    d = common.dims(config)
    hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
    attn = hf + "self_attn."
    yield mg + "input_layernorm.weight", get(hf + "input_layernorm.weight")
    yield mg + "self_attention.linear_qkv.weight", common.qkv_to_megatron(
        get(attn + "q_proj.weight"), get(attn + "k_proj.weight"), get(attn + "v_proj.weight"),
        d["heads"], d["groups"], d["head_dim"])
    if config["model_type"] == "qwen2":
        yield mg + "self_attention.linear_qkv.bias", common.qkv_to_megatron(
            get(attn + "q_proj.bias"), get(attn + "k_proj.bias"), get(attn + "v_proj.bias"),
            d["heads"], d["groups"], d["head_dim"])
    if config["model_type"] == "qwen3":
        yield mg + "self_attention.q_layernorm.weight", get(attn + "q_norm.weight")
        yield mg + "self_attention.k_layernorm.weight", get(attn + "k_norm.weight")
    yield mg + "self_attention.linear_proj.weight", get(attn + "o_proj.weight")
    yield mg + "pre_mlp_layernorm.weight", get(hf + "post_attention_layernorm.weight")


def mlp_to_megatron(hf: str, mg: str, get: Callable):
    yield mg + "linear_fc1.weight", common.gated_to_megatron(get(hf + "gate_proj.weight"),
                                                             get(hf + "up_proj.weight"))
    yield mg + "linear_fc2.weight", get(hf + "down_proj.weight")


def layer_to_hf(config: dict, i: int, get: Callable) -> Iterator[Tuple[str, object]]:
    yield from attention_to_hf(config, i, get)
    yield from mlp_to_hf(f"model.layers.{i}.mlp.", f"decoder.layers.{i}.mlp.", get)


def attention_to_hf(config: dict, i: int, get: Callable):
    d = common.dims(config)
    hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
    attn = hf + "self_attn."
    yield hf + "input_layernorm.weight", get(mg + "input_layernorm.weight")
    q, k, v = common.qkv_from_megatron(get(mg + "self_attention.linear_qkv.weight"),
                                       d["heads"], d["groups"], d["head_dim"])
    yield attn + "q_proj.weight", q
    yield attn + "k_proj.weight", k
    yield attn + "v_proj.weight", v
    if config["model_type"] == "qwen2":
        qb, kb, vb = common.qkv_from_megatron(get(mg + "self_attention.linear_qkv.bias"),
                                              d["heads"], d["groups"], d["head_dim"])
        yield attn + "q_proj.bias", qb
        yield attn + "k_proj.bias", kb
        yield attn + "v_proj.bias", vb
    if config["model_type"] == "qwen3":
        yield attn + "q_norm.weight", get(mg + "self_attention.q_layernorm.weight")
        yield attn + "k_norm.weight", get(mg + "self_attention.k_layernorm.weight")
    yield attn + "o_proj.weight", get(mg + "self_attention.linear_proj.weight")
    yield hf + "post_attention_layernorm.weight", get(mg + "pre_mlp_layernorm.weight")


def mlp_to_hf(hf: str, mg: str, get: Callable):
    gate, up = common.gated_from_megatron(get(mg + "linear_fc1.weight"))
    yield hf + "gate_proj.weight", gate
    yield hf + "up_proj.weight", up
    yield hf + "down_proj.weight", get(mg + "linear_fc2.weight")


def config_from_args(args, base: dict) -> dict:
    """The Hugging Face config of a checkpoint written by stock pretrain_gpt.py, from its args
    (``base``: what the family/model type and vocabulary contribute)."""
    kind = "qwen3" if getattr(args, "qk_layernorm", False) else (
        "qwen2" if getattr(args, "add_qkv_bias", False) else "llama")
    config = dict(base)
    config.update({
        "model_type": kind,
        "architectures": [next(a for a, k in ARCHITECTURES.items() if k == kind)],
        "hidden_size": args.hidden_size, "intermediate_size": args.ffn_hidden_size,
        "num_hidden_layers": args.num_layers, "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_query_groups if args.group_query_attention
        else args.num_attention_heads,
        "head_dim": args.kv_channels, "hidden_act": "silu",
        "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": common.arg(args, "layernorm_epsilon", "norm_epsilon"),
        "tie_word_embeddings": not args.untie_embeddings_and_output_weights,
        "attention_dropout": args.attention_dropout,
    })
    rope = {"rope_theta": float(args.rotary_base), "rope_type": "default"}
    if getattr(args, "use_rope_scaling", False):
        rope = {**rope, "rope_type": "llama3", "factor": float(args.rope_scaling_factor),
                **common.LLAMA3_FIXED}
    config["rope_parameters"] = rope
    if kind == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    if kind == "qwen3":
        config["attention_bias"] = False
    return config
