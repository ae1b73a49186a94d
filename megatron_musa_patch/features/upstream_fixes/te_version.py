"""Reading the TransformerEngine version without TransformerEngine.

megatron-core 0.16's ``megatron.core.utils.get_te_version`` returns ``None`` when TE is not
installed, so ``is_te_min_version`` (which compares that value with a version) and every caller
that compares ``get_te_version()`` itself raise a TypeError: ``OptimizerConfig`` for the
precision-aware optimizer, the T5 dataset, the language module's checkpoint hooks, and the
``conftest.py`` of upstream's own unit tests, which asks ``is_te_min_version("1.3")`` before every
test. 0.17 made the helper answer version 0.0.0 without TE; this fix does the same on 0.16, in the
helper itself, so every reader -- ``is_te_min_version`` and the modules holding ``from
megatron.core.utils import get_te_version`` copies (the patch applies as the module loads, before
they import it) -- sees "no TE version is new enough".
"""

from __future__ import annotations

from packaging.version import Version

from megatron_musa_patch.upstream.conditions import te_missing
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.facts import fixed_upstream
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "get_te_version / is_te_min_version answer 'no TE' (version 0.0.0) without TE")

#: what 0.17+ answers without TE
NO_TE_VERSION = Version("0.0.0")


@hookimpl
def mmp_register_patches(registry):
    until, ends = fixed_upstream("te_version_without_te", since="0.16.1")
    registry.add(FEATURE.patch(
        "", "megatron.core.utils:get_te_version", "wrap", _no_te_version,
        condition=te_missing, megatron=until, ends=ends,
        why="no TE means no TE version is new enough (what 0.17 answers: 0.0.0)"))


def _no_te_version(wrapped, instance, args, kwargs):
    found = wrapped(*args, **kwargs)
    return NO_TE_VERSION if found is None else found
