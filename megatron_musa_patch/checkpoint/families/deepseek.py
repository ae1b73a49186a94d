"""DeepSeek-V2 and V3: multi-latent attention (MLA), with or without a query LoRA
(DeepSeek-V2-Lite has none), dense first layers, then MoE layers of routed experts beside shared
experts. V3 routes on sigmoid scores with an aux-loss-free expert bias, group-limited top-k and
normalised, scaled weights; V2 on softmax scores, greedy top-k, weights neither normalised nor
(V2-Lite) scaled.

Megatron's local spec builds it with ``--multi-latent-attention`` (the layer's ``moe_mla_mtp.mla_local``
feature makes MLA run without TransformerEngine). Hugging Face's ``rope_interleave`` RoPE (the
rotary channels read in pairs) is what Megatron's MLA applies, so the rotary weights map as they
are; V2's complex-valued RoPE rotates the same pairs. YaRN RoPE scaling (what the released V2
and V3 use) maps to ``--rope-type yarn`` with its factor and mscales. The MTP layers of a hub
checkpoint (``num_nextn_predict_layers``, stored after the decoder layers with copies of the
embedding and output head) become Megatron's ``--mtp-num-layers``.
V2's ``group_limited_greedy`` (the full DeepSeek-V2: a group scored by its best expert) routes
through the layer's ``--moe-router-group-score max``; Megatron's own group-limited routing scores
a group by the sum of its best ones. Refused (Megatron would compute something else): YaRN
settings Megatron's MLA fixes otherwise (original_max_position_embeddings 4096, beta_fast 32,
beta_slow 1)."""

from __future__ import annotations

from typing import Callable, Iterator, List, Tuple

from ..errors import ConversionError
from . import common, dense

ARCHITECTURES = {"DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV2ForCausalLM": "deepseek_v2"}

_SHARED_FIELDS = {
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
    "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "qk_head_dim", "head_dim",
    "n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace",
    "norm_topk_prob", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "rope_parameters", "rope_theta", "rope_scaling", "attention_bias",
    "attention_dropout", "pretraining_tp", "topk_method", "moe_layer_freq", "ep_size",
    "aux_loss_alpha", "seq_aux",
}
#: DeepSeek-V2's group-limited routing (``topk_method``)
GROUP_LIMITED = "group_limited_greedy"
FIELDS = {
    "deepseek_v3": _SHARED_FIELDS | {"rope_interleave", "num_nextn_predict_layers",
                                     "scoring_func"},
    "deepseek_v2": _SHARED_FIELDS | {"mlp_bias", "scoring_func"},
}

#: what Megatron's MLA fixes for YaRN (MLATransformerConfig; no flag sets them on any release)
YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}


def version(config: dict) -> str:
    return config["model_type"]  # family_of checked it against the architecture


def check(config: dict) -> None:
    kind = version(config)
    common.check_fields(config, kind, FIELDS[kind])
    common.require(config, "hidden_act", ("silu",), "DeepSeek's MLPs are silu-gated")
    common.require(config, "attention_bias", (None, False), "MLA has no projection biases here")
    common.require(config, "pretraining_tp", (None, 1), "a sharded pretraining layout")
    common.require(config, "moe_layer_freq", (None, 1), "every layer after the dense ones is MoE")
    common.require(config, "n_shared_experts", lambda v: v is None or int(v) >= 0,
                   "a count of shared experts")
    if kind == "deepseek_v3":
        common.require(config, "rope_interleave", (None, True),
                       "Megatron's MLA reads the rotary channels in pairs (rope_interleave true)")
        common.require(config, "norm_topk_prob", (None, True),
                       "Megatron normalises sigmoid top-k weights")
        common.require(config, "topk_method", (None, "noaux_tc"),
                       "Megatron's expert-bias routing is DeepSeek-V3's noaux_tc")
        common.require(config, "scoring_func", (None, "sigmoid"), "V3 routes on sigmoid scores")
    else:
        common.require(config, "mlp_bias", (None, False), "DeepSeek's MLPs have no biases")
        common.require(config, "scoring_func", (None, "softmax"), "V2 routes on softmax scores")
        common.require(config, "norm_topk_prob", (None, False),
                       "transformers' DeepSeek-V2 scales the top-k softmax scores without "
                       "normalising them")
        common.require(config, "topk_method", (None, "greedy", GROUP_LIMITED),
                       "DeepSeek-V2 routes greedily (V2-Lite) or group-limited (V2)")
    _rope_flags(config)
    experts, groups = int(config["n_routed_experts"]), int(config.get("n_group") or 1)
    topk, group_topk = int(config["num_experts_per_tok"]), int(config.get("topk_group") or 1)
    if experts % groups:
        raise ConversionError(f"config.json: n_routed_experts={experts} is not a multiple of "
                              f"n_group={groups}. Nothing was written.")
    if kind == "deepseek_v3" and groups > 1 and topk // group_topk != 2:
        raise ConversionError(
            f"config.json: num_experts_per_tok={topk} with topk_group={group_topk}: "
            f"transformers scores a group by its top 2 experts, Megatron by its top "
            f"num_experts_per_tok/topk_group ({topk // group_topk}), so the routing would "
            f"differ. Nothing was written.")


def _groups(config: dict) -> Tuple[int, int]:
    """(expert groups, groups kept per token) of the routing: V2's greedy top-k has none."""
    if version(config) == "deepseek_v2" and config.get("topk_method") != GROUP_LIMITED:
        return 1, 1
    return int(config.get("n_group") or 1), int(config.get("topk_group") or 1)


def check_built_alike(args, core) -> None:
    """MLA without a query LoRA saved without --mla-q-proj-without-norm: from megatron-core 0.19
    its query projection normalises its input (a weight DeepSeek-V2's config has no place for),
    and the export, which builds the model with the flag, would leave that norm behind."""
    from megatron_musa_patch.upstream import facts

    fact = "mla_normalises_query_input_without_q_lora"
    if (getattr(args, "multi_latent_attention", False) and args.q_lora_rank is None
            and getattr(args, "qk_layernorm", False)
            and not getattr(args, "mla_q_proj_without_norm", False) and facts.holds(fact, core)):
        first = facts.since(fact)
        raise ConversionError(
            f"the checkpoint's multi-latent attention has no query LoRA and was saved without "
            f"--mla-q-proj-without-norm: megatron-core {core} normalises the query "
            f"projection's input then (a norm DeepSeek-V2's config cannot hold), which the "
            f"export would drop. Train such a model with --mla-q-proj-without-norm (import-hf "
            f"puts it in model_flags.txt), or export a checkpoint written by a release before "
            f"{first} with that release. Nothing was written.")


def _rope_flags(config: dict) -> List[str]:
    """Megatron's flags for the config's RoPE: default, or YaRN as Megatron's MLA computes it."""
    settings = common.rope(config)
    kind = settings["rope_type"]
    if kind == "default":
        return ["--rope-type", "rope"]
    if kind != "yarn":
        raise ConversionError(
            f"config.json: rope_type {kind!r} for {version(config)}: Megatron's MLA applies "
            f"default RoPE or YaRN. Nothing was written.")
    for name, fixed in YARN_FIXED.items():
        if settings.get(name) is not None and float(settings[name]) != fixed:
            raise ConversionError(
                f"config.json: YaRN {name}={settings[name]}: Megatron's MLA fixes it at {fixed} "
                f"(as the released DeepSeek models have it) and no flag changes it, so the "
                f"rotary frequencies would differ. Nothing was written.")
    if settings.get("factor") is None or settings.get("attention_factor") is not None:
        raise ConversionError(
            f"config.json: YaRN with factor={settings.get('factor')} and attention_factor="
            f"{settings.get('attention_factor')}: Megatron's flags give the factor and derive "
            f"the attention factor from the mscales. Nothing was written.")
    mscale, mscale_all_dim = settings.get("mscale"), settings.get("mscale_all_dim")
    if not (mscale and mscale_all_dim):
        # transformers then scales cos/sin by yarn_get_mscale(factor) alone, as Megatron does
        # with mscale 1 and mscale_all_dim 0; its softmax scale reads mscale_all_dim by itself
        if mscale_all_dim:
            raise ConversionError(
                f"config.json: YaRN mscale_all_dim={mscale_all_dim} without mscale: "
                f"transformers and Megatron derive different attention factors from it. "
                f"Nothing was written.")
        mscale, mscale_all_dim = 1.0, 0.0
    return ["--rope-type", "yarn", "--rotary-scaling-factor", common.number(settings["factor"]),
            "--mscale", repr(float(mscale)), "--mscale-all-dim", repr(float(mscale_all_dim))]


def _dense_layers(config: dict) -> int:
    return int(config.get("first_k_dense_replace") or 0)


def flags(config: dict) -> List[str]:
    layers, dense_layers = int(config["num_hidden_layers"]), _dense_layers(config)
    groups, group_topk = _groups(config)
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
           "--kv-lora-rank", str(int(config["kv_lora_rank"])),
           "--qk-head-dim", str(int(config["qk_nope_head_dim"])),
           "--qk-pos-emb-head-dim", str(int(config["qk_rope_head_dim"])),
           "--v-head-dim", str(int(config["v_head_dim"])),
           "--position-embedding-type", "rope", *_rope_flags(config),
           "--rotary-base", common.number(common.rope(config)["rope_theta"]),
           "--rotary-percent", "1.0",
           "--num-experts", str(int(config["n_routed_experts"])),
           "--moe-ffn-hidden-size", str(int(config["moe_intermediate_size"])),
           "--moe-shared-expert-intermediate-size",
           str(int(config["moe_intermediate_size"]) * int(config.get("n_shared_experts") or 0)),
           "--moe-layer-freq",  # a list without spaces: one word in model_flags.txt
           "[" + ",".join(["0"] * dense_layers + ["1"] * (layers - dense_layers)) + "]",
           "--moe-router-topk", str(int(config["num_experts_per_tok"])),
           "--moe-router-topk-scaling-factor",
           repr(float(config.get("routed_scaling_factor") or 1.0)),
           "--moe-router-dtype", "fp32"]
    if q_lora(config):
        out += ["--q-lora-rank", str(q_lora(config))]
    else:  # the query projected from the layer input as it is (0.19 adds a norm otherwise)
        out.append("--mla-q-proj-without-norm")
    if version(config) == "deepseek_v3":
        out += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                "--moe-router-load-balancing-type", "none"]
    else:  # softmax over every expert, then the top k unnormalised; V2's auxiliary loss
        alpha = float(config.get("aux_loss_alpha") or 0.0)
        balancing = ("seq_aux_loss" if config.get("seq_aux", True) else "aux_loss") if alpha \
            else "none"
        out += ["--moe-router-score-function", "softmax", "--moe-router-pre-softmax",
                "--moe-router-load-balancing-type", balancing]
        if alpha:
            out += ["--moe-aux-loss-coeff", repr(alpha)]
    if groups > 1:
        out += ["--moe-router-num-groups", str(groups), "--moe-router-group-topk",
                str(group_topk)]
        if version(config) == "deepseek_v2":  # a group ranked by its best expert (the layer's)
            out += ["--moe-router-group-score", "max"]
    if not config.get("n_shared_experts"):
        i = out.index("--moe-shared-expert-intermediate-size")
        del out[i:i + 2]
    if not config.get("tie_word_embeddings", False):
        out.append("--untie-embeddings-and-output-weights")
    if mtp_layers(config):
        out += ["--mtp-num-layers", str(mtp_layers(config))]
    return out


def q_lora(config: dict) -> int:
    return int(config.get("q_lora_rank") or 0)


def mtp_layers(config: dict) -> int:
    return int(config.get("num_nextn_predict_layers") or 0)


#: (Megatron name in self_attention., Hugging Face name in self_attn.): the query's LoRA, or
#: its one projection without (V2-Lite), then the key/value LoRA and the output
QUERY_LORA = (("linear_q_down_proj.weight", "q_a_proj.weight"),
              ("q_layernorm.weight", "q_a_layernorm.weight"),
              ("linear_q_up_proj.weight", "q_b_proj.weight"))
QUERY = (("linear_q_proj.weight", "q_proj.weight"),)
KEY_VALUE_OUTPUT = (("linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight"),
                    ("kv_layernorm.weight", "kv_a_layernorm.weight"),
                    ("linear_kv_up_proj.weight", "kv_b_proj.weight"),
                    ("linear_proj.weight", "o_proj.weight"))


def attention(config: dict):
    return (QUERY_LORA if q_lora(config) else QUERY) + KEY_VALUE_OUTPUT


def layer_to_megatron(config: dict, i: int, get: Callable,
                      mg: str = "") -> Iterator[Tuple[str, object]]:
    hf, mg = f"model.layers.{i}.", mg or f"decoder.layers.{i}."
    yield mg + "input_layernorm.weight", get(hf + "input_layernorm.weight")
    for ours, theirs in attention(config):
        yield mg + "self_attention." + ours, get(hf + "self_attn." + theirs)
    yield mg + "pre_mlp_layernorm.weight", get(hf + "post_attention_layernorm.weight")
    if i < _dense_layers(config):
        yield from dense.mlp_to_megatron(hf + "mlp.", mg + "mlp.", get)
        return
    yield mg + "mlp.router.weight", get(hf + "mlp.gate.weight")
    if version(config) == "deepseek_v3":
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
    for ours, theirs in attention(config):
        yield hf + "self_attn." + theirs, get(mg + "self_attention." + ours)
    yield hf + "post_attention_layernorm.weight", get(mg + "pre_mlp_layernorm.weight")
    if i < _dense_layers(config):
        yield from dense.mlp_to_hf(hf + "mlp.", mg + "mlp.", get)
        return
    yield hf + "mlp.gate.weight", get(mg + "mlp.router.weight")
    if version(config) == "deepseek_v3":
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
    v2 = getattr(args, "moe_router_score_function", "softmax") == "softmax"
    if v2 and not getattr(args, "moe_router_pre_softmax", False):
        raise ConversionError(
            "the checkpoint's MLA model routes on softmax scores normalised over the top k "
            "(no --moe-router-pre-softmax), which neither DeepSeek-V2's nor V3's config can say. "
            "Give a config with --hf-config.")
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
        "rope_parameters": _rope_from_args(args),
    })
    if v2:
        for name in ("rope_interleave", "num_nextn_predict_layers"):
            config.pop(name)
        balancing = getattr(args, "moe_router_load_balancing_type", "none")
        balancing = balancing[0] if isinstance(balancing, (list, tuple)) else balancing
        grouped = bool(args.moe_router_num_groups and args.moe_router_group_topk)
        if grouped and getattr(args, "moe_router_group_score", None) != "max":
            raise ConversionError(
                "the checkpoint's MLA model routes on softmax scores within expert groups "
                "ranked by the sum of their best experts (--moe-router-num-groups without "
                "--moe-router-group-score max), which DeepSeek-V2's config cannot say (its "
                "group_limited_greedy ranks a group by its best expert). Give a config with "
                "--hf-config.")
        config.update({
            "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"],
            "topk_method": GROUP_LIMITED if grouped else "greedy", "norm_topk_prob": False,
            "scoring_func": "softmax",
            "n_group": args.moe_router_num_groups, "topk_group": args.moe_router_group_topk,
            "aux_loss_alpha": float(getattr(args, "moe_aux_loss_coeff", 0.0) or 0.0)
            if balancing != "none" else 0.0, "seq_aux": balancing == "seq_aux_loss",
            "mlp_bias": False})
    return config


def _rope_from_args(args) -> dict:
    rope = {"rope_theta": float(args.rotary_base), "rope_type": "default"}
    if (getattr(args, "rope_type", None) or "yarn") == "yarn":  # MLA's default is YaRN
        rope.update({"rope_type": "yarn", "factor": float(args.rotary_scaling_factor),
                     "mscale": float(args.mscale), "mscale_all_dim": float(args.mscale_all_dim),
                     **YARN_FIXED})
    return rope


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
