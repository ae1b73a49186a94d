"""What the families share: reading a Hugging Face config, refusing what no mapping knows, and
the tensor layouts Megatron uses where Hugging Face keeps separate tensors."""

from __future__ import annotations

from typing import Dict, Iterable, List

from ..errors import ConversionError

#: config fields that describe how a checkpoint was saved or is run, not the network
BOOKKEEPING = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
    "initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "tokenizer_class",
    "output_router_logits", "use_return_dict", "torchscript", "tie_encoder_decoder",
    "pruned_heads", "add_cross_attention", "cross_attention_hidden_size", "finetuning_task",
    "task_specific_params", "prefix", "sep_token_id", "decoder_start_token_id",
    "quantization_config_", "max_length", "bad_words_ids", "num_labels",
    # which remote-code classes trust_remote_code would load (the DeepSeek hub configs carry it)
    "auto_map",
})


def check_fields(config: dict, family: str, understood: Iterable[str]) -> None:
    """Every field of ``config`` is understood by the family, or bookkeeping: a field nobody
    mapped could change the network without the conversion knowing."""
    unknown = sorted(set(config) - set(understood) - BOOKKEEPING)
    if unknown:
        raise ConversionError(
            f"config.json ({family}) has fields this conversion does not know: "
            f"{', '.join(unknown)}. They may change the network, so nothing was written. If "
            f"they do not (metadata of a newer transformers), remove them from a copy of the "
            f"directory; otherwise this model needs a mapping of its own.")


def require(config: dict, field: str, allowed, why: str) -> None:
    value = config.get(field)
    ok = value in allowed if isinstance(allowed, (tuple, list, set, frozenset)) else allowed(value)
    if not ok:
        raise ConversionError(
            f"config.json: {field}={value!r} is not supported: {why}. Nothing was written.")


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
             "--rotary-percent", "1.0"]
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


def number(value) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


# ----------------------------------------------------------------------------- layouts
# torch is imported where a layout is computed (in the worker), not with the module: mmp
# checkpoint's own process reads configs and plans without it


def qkv_to_megatron(q, k, v, heads: int, groups: int, head_dim: int):
    """Megatron's fused QKV: for each query group, its query heads, then its key, then its
    value ([groups * (heads/groups + 2) * head_dim, ...]); a bias likewise."""
    per_group = heads // groups
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * head_dim, *rest)
    k = k.reshape(groups, head_dim, *rest)
    v = v.reshape(groups, head_dim, *rest)
    import torch

    return torch.cat([q, k, v], dim=1).reshape(groups * (per_group + 2) * head_dim, *rest)


def qkv_from_megatron(qkv, heads: int, groups: int, head_dim: int):
    per_group = heads // groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * head_dim, *rest)
    q, k, v = grouped.split([per_group * head_dim, head_dim, head_dim], dim=1)
    return (q.reshape(heads * head_dim, *rest), k.reshape(groups * head_dim, *rest),
            v.reshape(groups * head_dim, *rest))


def gated_to_megatron(gate, up):
    """Megatron's gated MLP input projection: [gate; up] (its swiglu applies silu to the first
    half)."""
    import torch

    return torch.cat([gate, up], dim=0)


def gated_from_megatron(fc1):
    gate, up = fc1.chunk(2, dim=0)
    return gate, up


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
