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
beta_slow 1).

Kimi-K2 and Moonlight are DeepSeek-V3 networks: Moonlight's config says ``deepseek_v3``,
Kimi-K2's its own ``kimi_k2``; both map with V3's table. The released Kimi-K2 itself is refused
by the YaRN rule above (its ``beta_fast`` and ``beta_slow`` are 1); a checkpoint of its
architecture with default RoPE or Megatron's YaRN converts."""

from __future__ import annotations

from typing import Iterator, List, Tuple

from ..errors import ConversionError
from . import common
from .common import DECODER_FIELDS, EXPERTS, ROUTER, swiglu
from .fields import Field, fixed, sized, understood
from .rows import COLUMN, REPLICATED, ROW, Copy, Rename
from .table import EMBEDDING, LOCAL_SPEC, OUTPUT, Bound, Family, Section

#: DeepSeek-V2's group-limited routing (``topk_method``)
GROUP_LIMITED = "group_limited_greedy"
#: what Megatron's MLA fixes for YaRN (MLATransformerConfig; no flag sets them on any release)
YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}


def q_lora(config: dict) -> int:
    return int(config.get("q_lora_rank") or 0)


def mtp_layers(config: dict) -> int:
    return int(config.get("num_nextn_predict_layers") or 0)


def _dense_layers(config: dict) -> int:
    return int(config.get("first_k_dense_replace") or 0)


def _v2(config: dict) -> bool:
    return config["model_type"] == "deepseek_v2"


def _groups(config: dict) -> Tuple[int, int]:
    """(expert groups, groups kept per token) of the routing: V2's greedy top-k has none."""
    if _v2(config) and config.get("topk_method") != GROUP_LIMITED:
        return 1, 1
    return int(config.get("n_group") or 1), int(config.get("topk_group") or 1)


def _rope_flags(config: dict) -> List[str]:
    """Megatron's flags for the config's RoPE: default, or YaRN as Megatron's MLA computes it."""
    settings = common.rope(config)
    kind = settings["rope_type"]
    if kind == "default":
        return ["--rope-type", "rope"]
    if kind != "yarn":
        raise ConversionError(
            f"config.json: rope_type {kind!r} for {config['model_type']}: Megatron's MLA applies "
            f"default RoPE or YaRN. Nothing was written.")
    for name, value in YARN_FIXED.items():
        if settings.get(name) is not None and float(settings[name]) != value:
            raise ConversionError(
                f"config.json: YaRN {name}={settings[name]}: Megatron's MLA fixes it at {value} "
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


def _check_routing(config: dict) -> None:
    _rope_flags(config)
    experts, groups = int(config["n_routed_experts"]), int(config.get("n_group") or 1)
    topk, group_topk = int(config["num_experts_per_tok"]), int(config.get("topk_group") or 1)
    if experts % groups:
        raise ConversionError(f"config.json: n_routed_experts={experts} is not a multiple of "
                              f"n_group={groups}. Nothing was written.")
    if not _v2(config) and groups > 1 and topk // group_topk != 2:
        raise ConversionError(
            f"config.json: num_experts_per_tok={topk} with topk_group={group_topk}: "
            f"transformers scores a group by its top 2 experts, Megatron by its top "
            f"num_experts_per_tok/topk_group ({topk // group_topk}), so the routing would "
            f"differ. Nothing was written.")


def _layer_freq(config: dict) -> List[str]:
    layers, dense = int(config["num_hidden_layers"]), _dense_layers(config)
    # a list without spaces: one word in model_flags.txt
    return ["--moe-layer-freq", "[" + ",".join(["0"] * dense + ["1"] * (layers - dense)) + "]"]


def _dense_from_args(args) -> int:
    pattern = list(args.moe_layer_freq) if isinstance(args.moe_layer_freq, (list, tuple)) \
        else [1] * args.num_layers
    dense = pattern.index(1) if 1 in pattern else len(pattern)
    if pattern != [0] * dense + [1] * (len(pattern) - dense):
        raise ConversionError(
            f"the checkpoint's --moe-layer-freq {args.moe_layer_freq} is not dense layers "
            f"followed by MoE layers, which is all DeepSeek-V3's config can say.")
    return dense


def _shared(config: dict) -> List[str]:
    count = int(config.get("n_shared_experts") or 0)
    if not count:
        return []
    return ["--moe-shared-expert-intermediate-size",
            str(int(config["moe_intermediate_size"]) * count)]


def _shared_from_args(args) -> int:
    size = getattr(args, "moe_shared_expert_intermediate_size", None) or 0
    if size % args.moe_ffn_hidden_size:
        raise ConversionError(
            f"the checkpoint's --moe-shared-expert-intermediate-size {size} is not a multiple of "
            f"--moe-ffn-hidden-size {args.moe_ffn_hidden_size}: DeepSeek's config counts shared "
            f"experts of the routed experts' size. Give a config with --hf-config.")
    return size // args.moe_ffn_hidden_size


def _q_lora_flags(config: dict) -> List[str]:
    if q_lora(config):
        return ["--q-lora-rank", str(q_lora(config))]
    return ["--mla-q-proj-without-norm"]  # the query projected from the layer input as it is


def _group_flags(config: dict) -> List[str]:
    groups, group_topk = _groups(config)
    if groups <= 1:
        return []
    out = ["--moe-router-num-groups", str(groups), "--moe-router-group-topk", str(group_topk)]
    if _v2(config):  # a group ranked by its best expert (the layer's)
        out += ["--moe-router-group-score", "max"]
    return out


def _v2_routing(config: dict) -> List[str]:
    """Softmax over every expert, then the top k unnormalised; V2's auxiliary loss."""
    alpha = float(config.get("aux_loss_alpha") or 0.0)
    balancing = ("seq_aux_loss" if config.get("seq_aux", True) else "aux_loss") if alpha \
        else "none"
    out = ["--moe-router-score-function", "softmax", "--moe-router-pre-softmax",
           "--moe-router-load-balancing-type", balancing]
    return out + (["--moe-aux-loss-coeff", repr(alpha)] if alpha else [])


def _balancing(args) -> str:
    found = getattr(args, "moe_router_load_balancing_type", "none")
    return found[0] if isinstance(found, (list, tuple)) else found


def _v2_top_k(args):
    if not getattr(args, "moe_router_pre_softmax", False):
        raise ConversionError(
            "the checkpoint's MLA model routes on softmax scores normalised over the top k "
            "(no --moe-router-pre-softmax), which neither DeepSeek-V2's nor V3's config can say. "
            "Give a config with --hf-config.")
    return False


def _v2_topk_method(args) -> str:
    grouped = bool(args.moe_router_num_groups and args.moe_router_group_topk)
    if grouped and getattr(args, "moe_router_group_score", None) != "max":
        raise ConversionError(
            "the checkpoint's MLA model routes on softmax scores within expert groups "
            "ranked by the sum of their best experts (--moe-router-num-groups without "
            "--moe-router-group-score max), which DeepSeek-V2's config cannot say (its "
            "group_limited_greedy ranks a group by its best expert). Give a config with "
            "--hf-config.")
    return GROUP_LIMITED if grouped else "greedy"


_NAMES = ("vocab_size", "num_hidden_layers", "hidden_size", "intermediate_size",
          "num_attention_heads", "max_position_embeddings", "rms_norm_eps",
          "tie_word_embeddings", "attention_dropout", "hidden_act")
#: the fields V2 and V3 share
SHARED_FIELDS = tuple(f for f in DECODER_FIELDS if f.name in _NAMES) + (
    Field("num_key_value_heads", from_args=lambda a: a.num_attention_heads),  # MLA: all heads
    Field("head_dim", from_args=lambda a: a.qk_pos_emb_head_dim),
    Field("qk_head_dim", from_args=lambda a: a.qk_head_dim + a.qk_pos_emb_head_dim),
    Field("q_lora_rank", _q_lora_flags, lambda a: a.q_lora_rank),
    sized("kv_lora_rank", "--kv-lora-rank", "kv_lora_rank"),
    sized("qk_nope_head_dim", "--qk-head-dim", "qk_head_dim"),
    sized("qk_rope_head_dim", "--qk-pos-emb-head-dim", "qk_pos_emb_head_dim"),
    sized("v_head_dim", "--v-head-dim", "v_head_dim"),
    Field("rope_parameters", lambda c: [
        "--position-embedding-type", "rope", *_rope_flags(c), "--rotary-base",
        common.number(common.rope(c)["rope_theta"]), "--rotary-percent", "1.0"],
        lambda a: _rope_from_args(a)),
    *understood("rope_theta", "rope_scaling"),
    sized("n_routed_experts", "--num-experts", "num_experts"),
    sized("moe_intermediate_size", "--moe-ffn-hidden-size", "moe_ffn_hidden_size"),
    Field("n_shared_experts", _shared, lambda a: _shared_from_args(a),
          allowed=lambda v: v is None or int(v) >= 0, why="a count of shared experts"),
    Field("first_k_dense_replace", _layer_freq, _dense_from_args),
    sized("num_experts_per_tok", "--moe-router-topk", "moe_router_topk"),
    Field("routed_scaling_factor",
          lambda c: ["--moe-router-topk-scaling-factor",
                     repr(float(c.get("routed_scaling_factor") or 1.0))],
          lambda a: float(a.moe_router_topk_scaling_factor or 1.0)),
    Field("n_group", _group_flags),
    Field("topk_group"),
    fixed("attention_bias", (None, False), "MLA has no projection biases here", False),
    fixed("pretraining_tp", (None, 1), "a sharded pretraining layout"),
    fixed("moe_layer_freq", (None, 1), "every layer after the dense ones is MoE"),
    *understood("ep_size", "aux_loss_alpha", "seq_aux"),
)

def _written(fields, **from_args):
    """``fields`` with the export's value of each field named in ``from_args`` replaced."""
    return tuple(Field(f.name, f.flags, from_args[f.name], f.allowed, f.why)
                 if f.name in from_args else f for f in fields)


def _aux_loss_alpha(args) -> float:
    if _balancing(args) == "none":
        return 0.0
    return common.aux_loss_coeff(args)


V3_FIELDS = _written(SHARED_FIELDS, n_group=lambda a: a.moe_router_num_groups or 1,
                     topk_group=lambda a: a.moe_router_group_topk or 1) + (
    fixed("rope_interleave", (None, True),
          "Megatron's MLA reads the rotary channels in pairs (rope_interleave true)", True),
    fixed("norm_topk_prob", (None, True), "Megatron normalises sigmoid top-k weights", True),
    fixed("topk_method", (None, "noaux_tc"),
          "Megatron's expert-bias routing is DeepSeek-V3's noaux_tc"),
    Field("scoring_func", lambda c: [
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-load-balancing-type", "none"],
        allowed=(None, "sigmoid"), why="V3 routes on sigmoid scores"),
    Field("num_nextn_predict_layers",
          lambda c: ["--mtp-num-layers", str(mtp_layers(c))] if mtp_layers(c) else [],
          lambda a: getattr(a, "mtp_num_layers", None) or 0),
)

V2_FIELDS = _written(SHARED_FIELDS, n_group=lambda a: a.moe_router_num_groups,
                     topk_group=lambda a: a.moe_router_group_topk,
                     aux_loss_alpha=_aux_loss_alpha,
                     seq_aux=lambda a: _balancing(a) == "seq_aux_loss") + (
    fixed("mlp_bias", (None, False), "DeepSeek's MLPs have no biases", False),
    Field("scoring_func", _v2_routing, lambda a: "softmax", allowed=(None, "softmax"),
          why="V2 routes on softmax scores"),
    Field("norm_topk_prob", from_args=_v2_top_k, allowed=(None, False),
          why="transformers' DeepSeek-V2 scales the top-k softmax scores without normalising "
              "them"),
    Field("topk_method", from_args=_v2_topk_method, allowed=(None, "greedy", GROUP_LIMITED),
          why="DeepSeek-V2 routes greedily (V2-Lite) or group-limited (V2)"),
)


#: (Megatron name in self_attention., Hugging Face name in self_attn.): the query's LoRA, or
#: its one projection without (V2-Lite), then the key/value LoRA and the output
def _attention(pairs):
    return tuple(Rename("self_attention." + ours, "self_attn." + theirs, split)
                 for ours, theirs, split in pairs)


# the down projections too are column-parallel in the local spec (Megatron gathers them)
QUERY_LORA = _attention((("linear_q_down_proj.weight", "q_a_proj.weight", COLUMN),
                         ("q_layernorm.weight", "q_a_layernorm.weight", REPLICATED),
                         ("linear_q_up_proj.weight", "q_b_proj.weight", COLUMN)))
QUERY = _attention((("linear_q_proj.weight", "q_proj.weight", COLUMN),))
KEY_VALUE_OUTPUT = _attention((
    ("linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight", COLUMN),
    ("kv_layernorm.weight", "kv_a_layernorm.weight", REPLICATED),
    ("linear_kv_up_proj.weight", "kv_b_proj.weight", COLUMN),
    ("linear_proj.weight", "o_proj.weight", ROW)))


def _moe(config: dict, i: int) -> bool:
    return i >= _dense_layers(config)


def _with_shared(config: dict, i: int) -> bool:
    return _moe(config, i) and bool(config.get("n_shared_experts"))


def _layer(router):
    return (
        Section((Rename("input_layernorm.weight", "input_layernorm.weight"),)),
        Section(QUERY_LORA, where=lambda c, i: bool(q_lora(c))),
        Section(QUERY, where=lambda c, i: not q_lora(c)),
        Section(KEY_VALUE_OUTPUT + (Rename("pre_mlp_layernorm.weight",
                                           "post_attention_layernorm.weight"),)),
        Section(swiglu("mlp.", "mlp."), where=lambda c, i: not _moe(c, i)),
        Section(router, where=_moe),
        Section(swiglu("", ""), where=_moe, experts=EXPERTS),
        Section(swiglu("mlp.shared_experts.", "mlp.shared_experts."), where=_with_shared))


#: V3's aux-loss-free routing bias (kept in float32 on both sides)
EXPERT_BIAS = (Rename("mlp.router.expert_bias", "mlp.gate.e_score_correction_bias"),)

#: an MTP layer's own tensors besides its decoder layer: (Megatron, Hugging Face) under the layer
MTP_OWN = (Rename("enorm.weight", "enorm.weight"), Rename("hnorm.weight", "hnorm.weight"),
           Rename("eh_proj.weight", "eh_proj.weight", COLUMN),
           Rename("final_layernorm.weight", "shared_head.norm.weight"))


def _mtp(family: Family, config: dict) -> Iterator[Bound]:
    """The MTP layers (Hugging Face layer num_hidden_layers + k) with the copies of the
    embedding and output head a hub checkpoint keeps in each; their decoder layer is named
    ``transformer_layer`` (up to 0.18) or ``mtp_model_layer`` (0.19), which the worker
    resolves."""
    first = int(config["num_hidden_layers"])
    head = EMBEDDING if config.get("tie_word_embeddings") else OUTPUT
    head_hf = "model.embed_tokens.weight" if config.get("tie_word_embeddings") \
        else "lm_head.weight"
    for k in range(mtp_layers(config)):
        hf, mg = f"model.layers.{first + k}.", f"mtp.layers.{k}."
        for row in MTP_OWN:
            yield Bound(mg + row.megatron, (hf + row.hf,), row)
        yield Bound(EMBEDDING, (hf + "embed_tokens.weight",),
                    Copy(EMBEDDING, "", "model.embed_tokens.weight"))
        yield Bound(head, (hf + "shared_head.head.weight",), Copy(head, "", head_hf))
        yield from family.layer_mappings(config, first + k, mg + "transformer_layer.", hf)


def _made_from(score: str):
    def test(args) -> bool:
        return (bool(getattr(args, "multi_latent_attention", False))
                and getattr(args, "moe_router_score_function", "softmax") == score)
    return test




def _check_built_alike(args, core) -> None:
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


def _rope_from_args(args) -> dict:
    rope = {"rope_theta": float(args.rotary_base), "rope_type": "default"}
    if (getattr(args, "rope_type", None) or "yarn") == "yarn":  # MLA's default is YaRN
        rope.update({"rope_type": "yarn", "factor": float(args.rotary_scaling_factor),
                     "mscale": float(args.mscale), "mscale_all_dim": float(args.mscale_all_dim),
                     **YARN_FIXED})
    return rope


_MLA = LOCAL_SPEC + ("--multi-latent-attention", "--qk-layernorm", "--moe-router-dtype", "fp32")

V3 = Family("deepseek_v3", "DeepseekV3ForCausalLM", fields=V3_FIELDS,
            layer=_layer(ROUTER + EXPERT_BIAS), always=_MLA, checks=(_check_routing,),
            experts=lambda c: int(c["n_routed_experts"]), made_from_args=_made_from("sigmoid"),
            extra=_mtp, built_alike=_check_built_alike)
KIMI_K2 = Family("kimi_k2", "DeepseekV3ForCausalLM", fields=V3_FIELDS,
                 layer=V3.layer, always=_MLA, checks=(_check_routing,), experts=V3.experts,
                 extra=_mtp, built_alike=_check_built_alike)
V2 = Family("deepseek_v2", "DeepseekV2ForCausalLM", fields=V2_FIELDS, layer=_layer(ROUTER),
            always=_MLA, checks=(_check_routing,), experts=V3.experts,
            made_from_args=_made_from("softmax"), built_alike=_check_built_alike)

FAMILIES = (V3, KIMI_K2, V2)
