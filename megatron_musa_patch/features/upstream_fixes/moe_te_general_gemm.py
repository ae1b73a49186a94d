"""``moe_utils`` imports ``te_general_gemm`` only inside its TE ``try`` and then tests
``te_general_gemm is not None`` (NameError without TE): the name is defined as None, which
selects upstream's torch path."""

from __future__ import annotations

import sys

from ...hookspecs import hookimpl
from ...registry import Patch
from ...upstream.facts import fixed_upstream

FEATURE = "upstream_fixes.moe_te_general_gemm"
REQUIRED = False
DESCRIPTION = "moe_utils.te_general_gemm defined (None) without TE"
MOE_UTILS = "megatron.core.transformer.moe.moe_utils"


@hookimpl
def mmp_register_patches(registry):
    until, ends = fixed_upstream("moe_utils_defines_te_names", since="0.16.1")
    registry.add(Patch(
        FEATURE, f"{MOE_UTILS}:te_general_gemm", "attribute", None, FEATURE, create=True,
        condition=_undefined, megatron=until, ends=ends,
        why="define the name the router tests for (None: use torch.mm)"))


def _undefined():
    module = sys.modules.get(MOE_UTILS)
    if module is not None and "te_general_gemm" in vars(module):
        return "moe_utils defines te_general_gemm"
    return True
