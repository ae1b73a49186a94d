"""Exact resume where the device's random ops draw from the host generator (the CPU row).

Megatron-LM restores the RNG states from the checkpoint and only then builds the data iterators,
whose DataLoader draws its base seed from the host generator. On a GPU that draw does not touch
the device generator that dropout uses; on the CPU it shifts the dropout stream, so a resumed run
drops different units than the uninterrupted one. Building the iterators leaves the host RNG
state as it found it there, in every run, so both see the same stream.
"""

from __future__ import annotations

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "building the data iterators leaves the host RNG (the CPU row's dropout) untouched",
    aliases=("checkpoint_safety.exact_resume_rng",))


@hookimpl
def mmp_register_patches(registry, device):
    registry.add(FEATURE.patch(
        "", "megatron.training.training:build_train_valid_test_data_iterators", "wrap",
        _keep_host_rng_state,
        condition=lambda: device.rng_shared_with_host or
        f"dropout on {device.name} draws from the device's own generator",
        why="the DataLoader's seed draw does not shift the dropout stream of a resumed run"))


def _keep_host_rng_state(wrapped, instance, args, kwargs):
    import torch

    state = torch.get_rng_state()
    try:
        return wrapped(*args, **kwargs)
    finally:
        torch.set_rng_state(state)
