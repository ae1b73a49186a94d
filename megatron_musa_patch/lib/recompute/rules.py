"""Which recompute settings are refused, and why, in one paragraph each.

The same rules check Megatron's ``args`` (before Megatron validates them) and a
``TransformerConfig`` (the first time a patched layer runs with a flag on), so a megatron-core
user who sets ``config.attn_recompute`` in code gets the same errors as a command-line user.
"""

from __future__ import annotations

from typing import List

from megatron_musa_patch.upstream.conditions import importable

#: config/args attribute -> command-line flag
FLAGS = {
    "attn_recompute": "--attn-recompute",
    "mlp_recompute": "--mlp-recompute",
    "recompute_variance": "--recompute-variance",
}

#: MT-Megatron's RMSNorm variants
RMS_FLAGS = {
    "q_rms_recompute": "--q-rms-recompute",
    "mla_rms_recompute": "--mla-rms-recompute",
    "mlp_rms_recompute": "--mlp-rms-recompute",
}
ALL_FLAGS = {**FLAGS, **RMS_FLAGS}

#: the upstream ``--recompute-modules`` entries each flag already recomputes
COVERED = {
    "attn_recompute": ("core_attn", "mla_up_proj", "layernorm"),
    "mlp_recompute": ("mlp", "moe", "moe_act", "shared_experts", "layernorm"),
    "recompute_variance": ("layernorm",),
    "q_rms_recompute": ("mla_up_proj",),
    "mla_rms_recompute": (),
    "mlp_rms_recompute": ("moe", "shared_experts", "layernorm"),
}

_WHAT = {
    "attn_recompute": "the whole attention block (input norm, QKV, RoPE, core attention, "
                      "output projection)",
    "mlp_recompute": "the whole MLP block (pre-MLP norm, fc1, activation, fc2; on MoE layers the "
                     "experts and shared experts)",
    "recompute_variance": "the norm outputs",
    "q_rms_recompute": "MLA's q/kv RMSNorm outputs (the up projections' inputs)",
    "mla_rms_recompute": "the pre-attention RMSNorm and MLA's q/kv down projections",
    "mlp_rms_recompute": "the pre-MLP RMSNorm output and the shared expert of MoE layers",
}


def requested(settings, flags=ALL_FLAGS) -> List[str]:
    """The flags switched on in ``settings`` (attribute names)."""
    return [name for name in flags if getattr(settings, name, False)]


def granularity(settings):
    if getattr(settings, "recompute_activations", False):  # Megatron-LM's alias, not yet applied
        return "selective"
    if getattr(settings, "moe_layer_recompute", False) and \
            getattr(settings, "recompute_granularity", None) is None:
        return "selective"
    return getattr(settings, "recompute_granularity", None)


def upstream_modules(settings) -> List[str]:
    """The modules upstream's selective recompute will recompute (its defaults applied)."""
    if granularity(settings) != "selective":
        return []
    modules = getattr(settings, "recompute_modules", None)
    modules = list(modules) if modules is not None else ["core_attn"]
    if getattr(settings, "moe_layer_recompute", False) and "moe" not in modules:
        modules.append("moe")
    return modules


def full_recompute_is_off(settings) -> bool:
    """``--recompute-granularity full --recompute-method block --recompute-num-layers 0``: full
    granularity that recomputes no layer (MT-Megatron's scripts pass it with the fine-grained
    flags; upstream's block loop then runs every layer's normal forward)."""
    return (granularity(settings) == "full"
            and getattr(settings, "recompute_method", None) == "block"
            and getattr(settings, "recompute_num_layers", None) == 0)


def upstream_problems(settings) -> List[str]:
    """Upstream recompute settings that cannot work, whatever our flags say."""
    if (granularity(settings) == "full" and getattr(settings, "recompute_method", None) ==
            "uniform" and getattr(settings, "recompute_num_layers", None) == 0):
        return ["--recompute-granularity full --recompute-method uniform --recompute-num-layers "
                "0 never ends: upstream's uniform method advances by --recompute-num-layers "
                "layers at a time. Give --recompute-num-layers 1 or more (layers per recomputed "
                "chunk), or use --recompute-method block --recompute-num-layers 0 to recompute "
                "no layer fully."]
    return []


def problems(settings, *, check_impl: bool = True) -> List[str]:
    """One message per refused combination (empty: fine).

    ``check_impl``: also require ``transformer_impl == 'local'`` for ``--recompute-variance``
    (Megatron's args; a TransformerConfig built in code keeps the TE default whatever spec is
    used, so there the layer checks its modules when called instead).
    """
    flags = requested(settings)
    if not flags:
        return []
    named = " ".join(ALL_FLAGS[f] for f in flags)
    found = []
    if granularity(settings) == "full" and not full_recompute_is_off(settings):
        found.append(
            f"{named} cannot be combined with --recompute-granularity full --recompute-method "
            f"{getattr(settings, 'recompute_method', None)} --recompute-num-layers "
            f"{getattr(settings, 'recompute_num_layers', None)}: full recompute already "
            f"recomputes those layers from their input. Drop --recompute-granularity full (and "
            f"--recompute-method/--recompute-num-layers), give --recompute-method block "
            f"--recompute-num-layers 0 (no layer fully recomputed), or drop {named}.")
    modules = upstream_modules(settings)
    for flag in flags:
        twice = [m for m in modules if m in COVERED[flag]]
        if twice:
            listed = ", ".join(twice)
            implicit = "" if getattr(settings, "recompute_modules", None) is not None else (
                " (upstream's default when --recompute-granularity selective or "
                "--recompute-activations is given without --recompute-modules)")
            found.append(
                f"{ALL_FLAGS[flag]} already recomputes {_WHAT[flag]}, so --recompute-modules "
                f"{listed}{implicit} would request it twice. Remove {listed} from "
                f"--recompute-modules (or --recompute-activations), or drop {ALL_FLAGS[flag]}.")
    if getattr(settings, "fp8", None) or getattr(settings, "fp4", None):
        found.append(
            f"{named} is not supported with fp8/fp4 training: the recompute needs "
            f"TransformerEngine's fp8-aware checkpoint, which this feature does not drive. Use "
            f"upstream's --recompute-granularity selective --recompute-modules instead.")
    graphs = getattr(settings, "cuda_graph_impl", "none") not in (None, "none") or \
        getattr(settings, "enable_cuda_graph", False) or \
        getattr(settings, "external_cuda_graph", False)
    if graphs:
        found.append(f"{named} is not supported with CUDA graphs (--cuda-graph-impl): a "
                     f"captured layer cannot re-run part of itself in backward.")
    for attr, flag in (("cpu_offloading", "--cpu-offloading"),
                       ("fine_grained_activation_offloading",
                        "--fine-grained-activation-offloading"),
                       ("overlap_moe_expert_parallel_comm", "--overlap-moe-expert-parallel-comm")):
        if getattr(settings, attr, False):
            found.append(f"{named} is not supported with {flag} (it splits the layer's forward "
                         f"into pieces that these flags' checkpoints would cut across); drop one.")
    found += _rms_problems(settings, flags)
    if "recompute_variance" in flags:
        impl = getattr(settings, "transformer_impl", "local")
        if check_impl and impl != "local":
            found.append(
                f"--recompute-variance needs megatron-core's own layers (--transformer-impl "
                f"local): it applies the backward of the blocks' last linear layer "
                f"(RowParallelLinear) without re-running its forward, and recomputes separate "
                f"norm modules; --transformer-impl {impl} fuses norms into linears and brings "
                f"its own linear backward.")
        experts = getattr(settings, "num_experts", None) or getattr(settings, "num_moe_experts",
                                                                     None)
        if "mlp_recompute" in flags and experts and getattr(settings, "moe_grouped_gemm", False) \
                and importable("grouped_gemm"):
            found.append(
                "--recompute-variance with --mlp-recompute and --moe-grouped-gemm skips the "
                "grouped experts' fc2 GEMM in the recompute and applies its backward on its own; "
                "the installed grouped_gemm package, which then runs the experts, offers no such "
                "backward. Uninstall grouped_gemm (the layer's grouped GEMM, feature moe_fusion, "
                "then serves --moe-grouped-gemm), or drop --recompute-variance.")
    return found


def _rms_problems(settings, flags) -> List[str]:
    found = []
    mla = getattr(settings, "multi_latent_attention", False)
    if "q_rms_recompute" in flags:
        if not mla:
            found.append("--q-rms-recompute recomputes the q/kv RMSNorms of multi-latent "
                         "attention, and this model has none: add --multi-latent-attention, or "
                         "drop --q-rms-recompute.")
        elif not getattr(settings, "qk_layernorm", False):
            found.append("--q-rms-recompute recomputes MLA's q/kv RMSNorms, which exist only "
                         "with --qk-layernorm (without it they are identities): add "
                         "--qk-layernorm, or drop --q-rms-recompute.")
    if "mla_rms_recompute" in flags:
        if not mla:
            found.append("--mla-rms-recompute recomputes the pre-attention RMSNorm and the q/kv "
                         "down projections of multi-latent attention, and this model has none: "
                         "add --multi-latent-attention, or drop --mla-rms-recompute.")
        elif "attn_recompute" not in flags:
            found.append("--mla-rms-recompute works together with --attn-recompute (as in "
                         "MT-Megatron, which asserts it): its region -- the pre-attention "
                         "RMSNorm and the q/kv down projections -- is recomputed as part of the "
                         "attention block. Add --attn-recompute, or drop --mla-rms-recompute.")
    if "mlp_rms_recompute" in flags and "mlp_recompute" not in flags:
        experts = getattr(settings, "num_experts", None) or getattr(settings, "num_moe_experts",
                                                                     None)
        if not experts:
            found.append("--mlp-rms-recompute recomputes the pre-MLP RMSNorm and the shared "
                         "expert of MoE layers; on dense layers it acts only with "
                         "--mlp-recompute (as in MT-Megatron), and this model has no MoE "
                         "layers. Add --mlp-recompute (it recomputes the whole MLP block), or "
                         "drop --mlp-rms-recompute.")
    return found
