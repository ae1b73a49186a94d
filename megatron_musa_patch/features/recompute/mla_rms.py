"""MT-Megatron's RMSNorm recompute of multi-latent attention: ``--q-rms-recompute`` and
``--mla-rms-recompute`` (a part of the ``recompute`` feature).

* ``--q-rms-recompute``: the outputs of MLA's q and kv RMSNorms (the inputs of the q/kv up
  projections) are not kept for backward but recomputed from the norms' inputs (MT-Megatron:
  a checkpoint of each norm with its up projection). Needs ``--qk-layernorm``. Inside an
  attention block that ``--attn-recompute`` recomputes anyway it does nothing more.
* ``--mla-rms-recompute``: in MT-Megatron the pre-attention RMSNorm and the q/kv down
  projections are recomputed; it asserts ``--attn-recompute``, whose checkpoint here already
  recomputes both. Refused without ``--attn-recompute``, as MT-Megatron does (here at argument
  validation, not at the first step).

Carried onto the TransformerConfig as ``q_rms_recompute`` / ``mla_rms_recompute``; the logic is
in ``megatron_musa_patch/lib/recompute/rms.py``, the refusals in ``recompute/rules.py``.
"""

from __future__ import annotations

import functools

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.recompute import rms, rules
from megatron_musa_patch.core.feature import feature
from . import requirement

FEATURE = feature(
    __name__,
    "--q-rms-recompute, --mla-rms-recompute (MT-Megatron's MLA RMSNorm recompute)")

FLAGS = ("q_rms_recompute", "mla_rms_recompute")


@hookimpl
def mmp_register_patches(session, registry):
    registry.add(FEATURE.patch(
        "q_kv_norms",
        "megatron.core.transformer.multi_latent_attention:"
        "MLASelfAttention.get_query_key_value_tensors", "wrap",
        functools.partial(rms.mla_qkv_norms, requirement(session)),
        why="--q-rms-recompute: MLA's q/kv RMSNorm outputs released, recomputed in backward"))


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group(
        title="recompute: MLA RMSNorms", description="MT-Megatron spellings (megatron_musa_patch)")
    group.add_argument("--q-rms-recompute", action="store_true",
                       help="Do not keep the outputs of MLA's q/kv RMSNorms for backward; "
                            "recompute them (needs --qk-layernorm).")
    group.add_argument("--mla-rms-recompute", action="store_true",
                       help="Recompute the pre-attention RMSNorm and MLA's q/kv down "
                            "projections; with --attn-recompute, which already does.")


@hookimpl
def mmp_validate_args(args):
    found = [m for m in rules.problems(args) if any(rules.ALL_FLAGS[f] in m for f in FLAGS)]
    if found:
        raise ArgumentError(found[0])


@hookimpl
def mmp_transformer_config(args, config):
    for name in FLAGS:
        setattr(config, name, bool(getattr(args, name, False)))
