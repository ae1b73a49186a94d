"""``OptimizerConfig.__post_init__`` calls ``is_te_min_version`` for the precision-aware
optimizer; without TE that compares ``None`` with a version (TypeError). No TE means no TE
version is new enough."""

from __future__ import annotations

from ...compat.facts import fixed_upstream
from ...conditions import te_missing
from ...hookspecs import hookimpl
from ...registry import Patch

FEATURE = "upstream_fixes.te_version"
REQUIRED = False
DESCRIPTION = "is_te_min_version answers False without TE"


@hookimpl
def mmp_register_patches(registry):
    until, outside = fixed_upstream("te_version_without_te")
    registry.add(Patch(
        f"{FEATURE}.optimizer_config", "megatron.core.optimizer.optimizer_config:is_te_min_version",
        "wrap", _false, FEATURE, condition=te_missing, megatron=until, outside=outside,
        why="no TE means no TE version is new enough"))


def _false(wrapped, instance, args, kwargs):
    return False
