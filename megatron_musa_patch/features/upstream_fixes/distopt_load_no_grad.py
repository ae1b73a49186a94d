"""With the fp32 distributed optimizer its main parameters are views of the (grad-requiring)
model parameters, so loading a checkpoint's parameter state with ``copy_`` fails ("a view of a
leaf Variable that requires grad is being used in an in-place operation"): the copy runs under
``torch.no_grad()``."""

from __future__ import annotations

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

# after distopt_step_counters: inside its wrapper of _set_main_param_and_optimizer_states
FEATURE = feature(
    __name__,
    "fp32 distributed-optimizer state loads into parameter views without autograd",
    after=("upstream_fixes.distopt_step_counters",))


@hookimpl
def mmp_register_patches(registry):
    registry.add(
        FEATURE.patch(
            "",
            "megatron.core.optimizer.distrib_optimizer:"
            "DistributedOptimizer._set_main_param_and_optimizer_states",
            "wrap",
            _without_grad,
            why="fp32 main params are views of grad-requiring params: copy without autograd",
        )
    )


def _without_grad(wrapped, instance, args, kwargs):
    import torch

    with torch.no_grad():
        return wrapped(*args, **kwargs)
