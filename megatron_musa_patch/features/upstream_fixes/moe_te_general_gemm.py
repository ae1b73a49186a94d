"""``moe_utils`` imports ``te_general_gemm`` only inside its TE ``try`` and then tests
``te_general_gemm is not None`` (NameError without TE): the name is defined as None, which
selects upstream's torch path."""

from __future__ import annotations

import sys

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.facts import fixed_upstream
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "moe_utils.te_general_gemm defined (None) without TE")
MOE_UTILS = "megatron.core.transformer.moe.moe_utils"


@hookimpl
def mmp_register_patches(registry):
    until, ends = fixed_upstream("moe_utils_defines_te_names", since="0.16.1")
    registry.add(FEATURE.patch(
        "", f"{MOE_UTILS}:te_general_gemm", "attribute", None, create=True,
        condition=_undefined, megatron=until, ends=ends,
        why="define the name the router tests for (None: use torch.mm)"))


def _undefined():
    module = sys.modules.get(MOE_UTILS)
    if module is not None and "te_general_gemm" in vars(module):
        return "moe_utils defines te_general_gemm"
    return True
