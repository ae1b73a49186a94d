"""DeepSeek-V3: multi-latent attention (MLA) with a query LoRA, dense first layers, then MoE
layers of routed experts (sigmoid scores, aux-loss-free expert bias, group-limited top-k,
normalised and scaled weights) beside shared experts.

Megatron's local spec builds it with ``--multi-latent-attention`` (the layer's ``mla_local``
feature makes MLA run without TransformerEngine). Hugging Face's ``rope_interleave`` RoPE (the
rotary channels read in pairs) is what Megatron's MLA applies, so the rotary weights map as they
are. The MTP layers of a hub checkpoint (``num_nextn_predict_layers``, stored after the decoder
layers with copies of the embedding and output head) become Megatron's ``--mtp-num-layers``.
Not mapped yet (refused): YaRN RoPE scaling, no query LoRA (DeepSeek-V2-Lite)."""

from __future__ import annotations

from typing import Callable, Iterator, List, Tuple

from ..errors import ConversionError
from . import common, dense

ARCHITECTURES = {"DeepseekV3ForCausalLM": "deepseek_v3"}

FIELDS = {
    "deepseek_v3": {
        "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
        "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
        "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "qk_head_dim", "head_dim",
        "n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace",
        "norm_topk_prob", "hidden_act", "max_position_embeddings", "rms_norm_eps",
        "tie_word_embeddings", "rope_parameters", "rope_theta", "rope_scaling",
        "rope_interleave", "attention_bias", "attention_dropout", "pretraining_tp",
        "num_nextn_predict_layers", "topk_method", "scoring_func", "moe_layer_freq", "ep_size",
        "aux_loss_alpha", "seq_aux",
    },
}


def check(config: dict) -> None:
    common.check_fields(config, "deepseek_v3", FIELDS["deepseek_v3"])
    common.require(config, "hidden_act", ("silu",), "DeepSeek's MLPs are silu-gated")
    common.require(config, "attention_bias", (None, False), "MLA has no projection biases here")
    common.require(config, "pretraining_tp", (None, 1), "a sharded pretraining layout")
    common.require(config, "q_lora_rank", lambda v: v is not None and int(v) > 0,
                   "MLA without a query LoRA (DeepSeek-V2-Lite) is not mapped yet")
    common.require(config, "rope_interleave", (None, True),
                   "Megatron's MLA reads the rotary channels in pairs (rope_interleave true)")
    common.require(config, "norm_topk_prob", (None, True),
                   "Megatron normalises sigmoid top-k weights")
    common.require(config, "topk_method", (None, "noaux_tc"),
                   "Megatron's expert-bias routing is DeepSeek-V3's noaux_tc")
    common.require(config, "scoring_func", (None, "sigmoid"), "V3 routes on sigmoid scores")
    common.require(config, "moe_layer_freq", (None, 1), "every layer after the dense ones is MoE")
    if common.rope(config)["rope_type"] != "default":
        raise ConversionError(
            f"config.json: rope_type {common.rope(config)['rope_type']!r} for DeepSeek-V3 "
            f"(YaRN) is not mapped yet; default RoPE is. Nothing was written.")
    experts, groups = int(config["n_routed_experts"]), int(config.get("n_group") or 1)
    topk, group_topk = int(config["num_experts_per_tok"]), int(config.get("topk_group") or 1)
    if experts % groups:
        raise ConversionError(f"config.json: n_routed_experts={experts} is not a multiple of "
                              f"n_group={groups}. Nothing was written.")
    if groups > 1 and topk // group_topk != 2:
        raise ConversionError(
            f"config.json: num_experts_per_tok={topk} with topk_group={group_topk}: "
            f"transformers scores a group by its top 2 experts, Megatron by its top "
            f"num_experts_per_tok/topk_group ({topk // group_topk}), so the routing would "
            f"differ. Nothing was written.")


def _dense_layers(config: dict) -> int:
    return int(config.get("first_k_dense_replace") or 0)


def flags(config: dict) -> List[str]:
    layers, dense_layers = int(config["num_hidden_layers"]), _dense_layers(config)
    groups, group_topk = int(config.get("n_group") or 1), int(config.get("topk_group") or 1)
    out = ["--transformer-impl", "local",
           "--num-layers", str(layers),
           "--hidden-size", str(int(config["hidden_size"])),
           "--ffn-hidden-size", str(int(config["intermediate_size"])),
           "--num-attention-heads", str(int(config["num_attention_heads"])),
           "--max-position-embeddings", str(int(config["max_position_embeddings"])),
           "--normalization", "RMSNorm", "--norm-epsilon", repr(float(config["rms_norm_eps"])),
           "--swiglu", "--disable-bias-linear", "--hidden-dropout", "0.0",
           "--attention-dropout", repr(float(config.get("attention_dropout") or 0.0)),
           "--multi-latent-attention", "--qk-layernorm",
           "--q-lora-rank", str(int(config["q_lora_rank"])),
           "--kv-lora-rank", str(int(config["kv_lora_rank"])),
           "--qk-head-dim", str(int(config["qk_nope_head_dim"])),
           "--qk-pos-emb-head-dim", str(int(config["qk_rope_head_dim"])),
           "--v-head-dim", str(int(config["v_head_dim"])),
           "--position-embedding-type", "rope", "--rope-type", "rope",
           "--rotary-base", common.number(common.rope(config)["rope_theta"]),
           "--rotary-percent", "1.0",
           "--num-experts", str(int(config["n_routed_experts"])),
           "--moe-ffn-hidden-size", str(int(config["moe_intermediate_size"])),
           "--moe-shared-expert-intermediate-size",
           str(int(config["moe_intermediate_size"]) * int(config.get("n_shared_experts") or 0)),
           "--moe-layer-freq",  # a list without spaces: one word in model_flags.txt
           "[" + ",".join(["0"] * dense_layers + ["1"] * (layers - dense_layers)) + "]",
           "--moe-router-topk", str(int(config["num_experts_per_tok"])),
           "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
           "--moe-router-topk-scaling-factor",
           repr(float(config.get("routed_scaling_factor") or 1.0)),
           "--moe-router-load-balancing-type", "none", "--moe-router-dtype", "fp32"]
    if groups > 1:
        out += ["--moe-router-num-groups", str(groups), "--moe-router-group-topk",
                str(group_topk)]
    if not config.get("n_shared_experts"):
        i = out.index("--moe-shared-expert-intermediate-size")
        del out[i:i + 2]
    if not config.get("tie_word_embeddings", False):
        out.append("--untie-embeddings-and-output-weights")
    if mtp_layers(config):
        out += ["--mtp-num-layers", str(mtp_layers(config))]
    return out


def mtp_layers(config: dict) -> int:
    return int(config.get("num_nextn_predict_layers") or 0)


#: (Megatron name in self_attention., Hugging Face name in self_attn.)
ATTENTION = (("linear_q_down_proj.weight", "q_a_proj.weight"),
             ("q_layernorm.weight", "q_a_layernorm.weight"),
             ("linear_q_up_proj.weight", "q_b_proj.weight"),
             ("linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight"),
             ("kv_layernorm.weight", "kv_a_layernorm.weight"),
             ("linear_kv_up_proj.weight", "kv_b_proj.weight"),
             ("linear_proj.weight", "o_proj.weight"))


def layer_to_megatron(config: dict, i: int, get: Callable,
                      mg: str = "") -> Iterator[Tuple[str, object]]:
    hf, mg = f"model.layers.{i}.", mg or f"decoder.layers.{i}."
    yield mg + "input_layernorm.weight", get(hf + "input_layernorm.weight")
    for ours, theirs in ATTENTION:
        yield mg + "self_attention." + ours, get(hf + "self_attn." + theirs)
    yield mg + "pre_mlp_layernorm.weight", get(hf + "post_attention_layernorm.weight")
    if i < _dense_layers(config):
        yield from dense.mlp_to_megatron(hf + "mlp.", mg + "mlp.", get)
        return
    yield mg + "mlp.router.weight", get(hf + "mlp.gate.weight")
    yield mg + "mlp.router.expert_bias", get(hf + "mlp.gate.e_score_correction_bias")
    for e in range(int(config["n_routed_experts"])):
        yield from dense.mlp_to_megatron(f"{hf}mlp.experts.{e}.",
                                         f"{mg}mlp.experts.local_experts.{e}.", get)
    if config.get("n_shared_experts"):
        yield from dense.mlp_to_megatron(hf + "mlp.shared_experts.",
                                         mg + "mlp.shared_experts.", get)


def layer_to_hf(config: dict, i: int, get: Callable, mg: str = "") -> Iterator[Tuple[str, object]]:
    hf, mg = f"model.layers.{i}.", mg or f"decoder.layers.{i}."
    yield hf + "input_layernorm.weight", get(mg + "input_layernorm.weight")
    for ours, theirs in ATTENTION:
        yield hf + "self_attn." + theirs, get(mg + "self_attention." + ours)
    yield hf + "post_attention_layernorm.weight", get(mg + "pre_mlp_layernorm.weight")
    if i < _dense_layers(config):
        yield from dense.mlp_to_hf(hf + "mlp.", mg + "mlp.", get)
        return
    yield hf + "mlp.gate.weight", get(mg + "mlp.router.weight")
    yield hf + "mlp.gate.e_score_correction_bias", get(mg + "mlp.router.expert_bias")
    for e in range(int(config["n_routed_experts"])):
        yield from dense.mlp_to_hf(f"{hf}mlp.experts.{e}.",
                                   f"{mg}mlp.experts.local_experts.{e}.", get)
    if config.get("n_shared_experts"):
        yield from dense.mlp_to_hf(hf + "mlp.shared_experts.", mg + "mlp.shared_experts.", get)


def config_from_args(args, base: dict) -> dict:
    pattern = list(args.moe_layer_freq) if isinstance(args.moe_layer_freq, (list, tuple)) \
        else [1] * args.num_layers
    dense_layers = pattern.index(1) if 1 in pattern else len(pattern)
    if pattern != [0] * dense_layers + [1] * (len(pattern) - dense_layers):
        raise ConversionError(
            f"the checkpoint's --moe-layer-freq {args.moe_layer_freq} is not dense layers "
            f"followed by MoE layers, which is all DeepSeek-V3's config can say.")
    shared = getattr(args, "moe_shared_expert_intermediate_size", None) or 0
    config = dict(base)
    config.update({
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": args.hidden_size, "intermediate_size": args.ffn_hidden_size,
        "moe_intermediate_size": args.moe_ffn_hidden_size,
        "num_hidden_layers": args.num_layers, "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_attention_heads,
        "n_routed_experts": args.num_experts, "n_shared_experts": shared //
        args.moe_ffn_hidden_size, "num_experts_per_tok": args.moe_router_topk,
        "routed_scaling_factor": float(args.moe_router_topk_scaling_factor or 1.0),
        "n_group": args.moe_router_num_groups or 1, "topk_group": args.moe_router_group_topk or 1,
        "first_k_dense_replace": dense_layers, "norm_topk_prob": True,
        "q_lora_rank": args.q_lora_rank, "kv_lora_rank": args.kv_lora_rank,
        "qk_nope_head_dim": args.qk_head_dim, "qk_rope_head_dim": args.qk_pos_emb_head_dim,
        "qk_head_dim": args.qk_head_dim + args.qk_pos_emb_head_dim,
        "head_dim": args.qk_pos_emb_head_dim, "v_head_dim": args.v_head_dim,
        "hidden_act": "silu", "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": common.arg(args, "layernorm_epsilon", "norm_epsilon"),
        "tie_word_embeddings": not args.untie_embeddings_and_output_weights,
        "attention_bias": False, "attention_dropout": args.attention_dropout,
        "rope_interleave": True, "num_nextn_predict_layers": getattr(args, "mtp_num_layers",
                                                                     None) or 0,
        "rope_parameters": {"rope_theta": float(args.rotary_base), "rope_type": "default"},
    })
    return config


#: an MTP layer's own tensors besides its decoder layer: (Megatron, Hugging Face) under the layer
MTP_OWN = (("enorm.weight", "enorm.weight"), ("hnorm.weight", "hnorm.weight"),
           ("eh_proj.weight", "eh_proj.weight"), ("final_layernorm.weight",
                                                  "shared_head.norm.weight"))
#: the copies of the embedding and output head a hub checkpoint keeps in each MTP layer
MTP_SHARED = (("embed_tokens.weight", "model.embed_tokens.weight"),
              ("shared_head.head.weight", "lm_head.weight"))


def extra_to_megatron(config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
    """The MTP layers (Hugging Face layer num_hidden_layers + k); their decoder layer is named
    ``transformer_layer`` (up to 0.18) or ``mtp_model_layer`` (0.19), which the worker resolves."""
    import torch

    first = int(config["num_hidden_layers"])
    for k in range(mtp_layers(config)):
        hf, mg = f"model.layers.{first + k}.", f"mtp.layers.{k}."
        for ours, theirs in MTP_OWN:
            yield mg + ours, get(hf + theirs)
        for theirs, main in MTP_SHARED:
            main = "model.embed_tokens.weight" if config.get("tie_word_embeddings") else main
            if not torch.equal(get(hf + theirs), get(main)):
                raise ConversionError(
                    f"{hf}{theirs} differs from {main}: Megatron's MTP layers share the "
                    f"model's embedding and output head, so this checkpoint cannot be held "
                    f"as it is. Nothing was written.")
        yield from layer_to_megatron(config, first + k, get, mg + "transformer_layer.")


def extra_to_hf(config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
    first = int(config["num_hidden_layers"])
    for k in range(mtp_layers(config)):
        hf, mg = f"model.layers.{first + k}.", f"mtp.layers.{k}."
        yield from layer_to_hf(config, first + k, get, mg + "transformer_layer.")
        for ours, theirs in MTP_OWN:
            yield hf + theirs, get(mg + ours)
        yield hf + "embed_tokens.weight", get("embedding.word_embeddings.weight")
        yield hf + "shared_head.head.weight", get(
            "embedding.word_embeddings.weight" if config.get("tie_word_embeddings")
            else "output_layer.weight")
