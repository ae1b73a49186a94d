"""``--mla-q-proj-without-norm``: multi-latent attention without a query LoRA (``--q-lora-rank``
unset, as DeepSeek-V2-Lite) projects the query from the layer's input as it is, with
``--qk-layernorm`` normalising the key/value LoRA only: the model DeepSeek-V2-Lite is, and the
one megatron-core built up to 0.18.

From 0.19 megatron-core's Q/KV norm resolver (``QKNormConfigResolver``) makes that projection a
fused norm+linear whenever ``--qk-layernorm`` is on, a norm of the query input the released
model does not have (and without ``--qk-layernorm`` the key/value norm it does have goes too).
With this flag the resolver's query projection is the backend's plain column-parallel linear
again; before 0.19 there is nothing to change.
"""

from __future__ import annotations

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream import facts
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--mla-q-proj-without-norm (MLA without a query LoRA: no norm before the query projection, "
    "as DeepSeek-V2-Lite and megatron-core before 0.19)",
    aliases=("mla_q_proj_without_norm",))

#: what the record undoes, and from which release megatron-core does it
FACT = "mla_normalises_query_input_without_q_lora"


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("multi-latent attention")
    group.add_argument("--mla-q-proj-without-norm", action="store_true",
                       help="Without --q-lora-rank, project the query from the layer input "
                            "without normalising it (DeepSeek-V2-Lite; megatron-core before 0.19 "
                            "always did, 0.19 adds a norm under --qk-layernorm).")


@hookimpl
def mmp_validate_args(args):
    if not getattr(args, "mla_q_proj_without_norm", False):
        return
    if not getattr(args, "multi_latent_attention", False):
        raise ArgumentError("--mla-q-proj-without-norm shapes multi-latent attention: add "
                            "--multi-latent-attention (or drop it).")
    if getattr(args, "q_lora_rank", None) is not None:
        raise ArgumentError(
            f"--mla-q-proj-without-norm applies to MLA without a query LoRA; with --q-lora-rank "
            f"{args.q_lora_rank} the query's norm is the LoRA's own (q_layernorm): drop one of "
            f"them.")


@hookimpl
def mmp_transformer_config(args, config):
    config.mla_q_proj_without_norm = bool(getattr(args, "mla_q_proj_without_norm", False))


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "resolve",
        "megatron.core.transformer.mla_qk_norm_config:QKNormConfigResolver.resolve", "wrap",
        _plain_q_proj, megatron=f">={facts.since(FACT)}",
        starts=f"megatron-core {facts.since(FACT)} adds the query norm",
        why="--mla-q-proj-without-norm: the query projection without the norm 0.19 fuses in"))


def _plain_q_proj(wrapped, instance, args, kwargs):
    resolved = wrapped(*args, **kwargs)
    config = instance.config
    if (getattr(config, "mla_q_proj_without_norm", False) and config.q_lora_rank is None
            and not getattr(instance, "is_dsa", False)):
        resolved = dict(resolved, linear_q_proj=instance.linear_impl)
    return resolved
