"""Building the optimizer from an ``OptimizerConfig`` whose ``lr`` is unset, without Apex/TE.

``OptimizerConfig.lr`` defaults to ``None``: the learning rate is the scheduler's to set before
each step (``OptimizerParamScheduler``). TE's and Apex's ``FusedAdam``/``FusedSGD`` store that
``None``; the torch optimizers megatron-core falls back to without them check it in their
constructor (``if not 0.0 <= lr``) and raise a TypeError, so every caller that builds an
optimizer before choosing its learning rate -- upstream's own checkpointing tests among them --
works on NVIDIA's setups and fails on every TE-less one. The fix builds the torch optimizer with
a placeholder and then gives its parameter groups (and defaults) the ``None`` the fused
optimizers hold, so a step taken before the learning rate is set still fails, as it does there.
"""

from __future__ import annotations

import sys

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "the TE-less torch optimizers accept OptimizerConfig's unset lr, as FusedAdam does")

OPTIMIZER = "megatron.core.optimizer"
#: passes torch's constructor checks; replaced by None before anyone can read it
_PLACEHOLDER_LR = 0.0


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{OPTIMIZER}:_get_megatron_optimizer_based_on_param_groups", "wrap",
        _build_with_lr_unset,
        why="torch's optimizers reject lr=None in their constructor; TE's/Apex's keep it"))


def _build_with_lr_unset(wrapped, instance, args, kwargs):
    config = call_arguments(wrapped, args, kwargs).get("config")
    module = sys.modules.get(OPTIMIZER)
    if (config is None or getattr(config, "lr", 0.0) is not None
            or not getattr(module, "USING_PYTORCH_OPTIMIZER", False)):
        return wrapped(*args, **kwargs)
    config.lr = _PLACEHOLDER_LR
    try:
        built = wrapped(*args, **kwargs)
    finally:
        config.lr = None
    for torch_optimizer in _torch_optimizers(built):
        torch_optimizer.defaults["lr"] = None
        for group in torch_optimizer.param_groups:
            if group.get("lr") == _PLACEHOLDER_LR:
                group["lr"] = None
    return built


def _torch_optimizers(built):
    """The torch optimizers inside what megatron-core returned (a ``MegatronOptimizer`` holds one
    as ``.optimizer``; the CPU-offload ``HybridDeviceOptimizer`` holds several)."""
    import torch

    inner = getattr(built, "optimizer", built)
    found = [inner] if isinstance(inner, torch.optim.Optimizer) else []
    for sub in getattr(inner, "sub_optimizers", ()) or ():
        if isinstance(sub, torch.optim.Optimizer):
            found.append(sub)
    return found
