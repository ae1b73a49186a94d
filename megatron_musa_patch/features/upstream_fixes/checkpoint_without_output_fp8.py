"""``CheckpointWithoutOutput(fp8=False)`` sets ``self.fp8 = fp8 is not None`` (True), so its
forward takes the fp8 branch and hits ``FP8GlobalStateManager`` (NameError without TE). Here
``fp8`` means fp8: True only with TE and an fp8 recipe."""

from __future__ import annotations

import sys

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import te_missing
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "CheckpointWithoutOutput without TE does not take its fp8 branch")

RANDOM = "megatron.core.tensor_parallel.random"


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{RANDOM}:CheckpointWithoutOutput.__init__", "wrap", _init,
        condition=te_missing,
        why="fp8=False/None means no fp8; without TE there is no fp8 at all"))


def _init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    fp8 = call_arguments(wrapped, args, kwargs).get("fp8", False)
    instance.fp8 = bool(getattr(sys.modules[RANDOM], "HAVE_TE", False)) and fp8 not in (None,
                                                                                         False)
