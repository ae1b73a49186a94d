"""Shared names of the checkpoint-safety plugins."""

from __future__ import annotations

import sys

from megatron_musa_patch.base.errors import MegatronMusaPatchError

CHECKPOINTING = "megatron.training.checkpointing"


class CheckpointError(MegatronMusaPatchError):
    """A checkpoint directory that cannot be resumed from as it is."""


def msc_enabled() -> bool:
    """Megatron's multi-storage client is on: paths are object-store URLs, not files here."""
    module = sys.modules.get("megatron.core.msc_utils")
    feature = getattr(module, "MultiStorageClientFeature", None)
    return bool(feature is not None and feature.is_enabled())
