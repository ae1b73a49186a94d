"""``--tp-only-amax-red``: reduce the FP8 amax only over the tensor(-and-context)-parallel group,
not the data-parallel ranks too (MT-Megatron's flag for megatron-core's config field
``tp_only_amax_red``, which upstream has no flag for; its FP8 context reads it).

Without FP8 (``--fp8-format``) or FP4 there is no amax to reduce: refused, naming the flag.
"""

from __future__ import annotations

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--tp-only-amax-red: FP8 amax reduced over the TP group only (config field)")


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("FP8 (MT-Megatron spellings)")
    group.add_argument("--tp-only-amax-red", action="store_true",
                       help="Reduce the FP8 amax only over the tensor(-context)-parallel group.")


@hookimpl
def mmp_validate_args(args):
    if getattr(args, "tp_only_amax_red", False) and not (getattr(args, "fp8", None) or
                                                         getattr(args, "fp4", None)):
        raise ArgumentError(
            "--tp-only-amax-red chooses the group over which FP8 training reduces its amax "
            "(scaling) statistics; this run trains without FP8 (no --fp8-format or "
            "--fp4-format), so it has no amax to reduce and the flag cannot mean anything. "
            "Remove --tp-only-amax-red, or train in FP8 (--fp8-format, which needs "
            "TransformerEngine).")


@hookimpl
def mmp_transformer_config(args, config):
    if getattr(args, "tp_only_amax_red", False):
        config.tp_only_amax_red = True
