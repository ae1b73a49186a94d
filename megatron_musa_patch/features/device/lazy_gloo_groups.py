"""On the CPU row a new process group connects to its peers on first use, as NCCL's do.

Megatron creates tens of groups per initialisation and uses few of them, which costs nothing on
NCCL (and MCCL): a communicator is made on a group's first collective. A gloo group connects to
every peer when it is created, so each ``new_group`` waits for all its members, and code that
relies on NCCL's laziness hangs: upstream's ``pipeline_parallel/test_schedules.py`` creates the
embedding groups with rank-dependent members (each rank passes its own pipeline group), which is
harmless with NCCL, while two eager gloo groups of one name wait for each other for ever.

torch's gloo backend connects lazily under ``TORCH_GLOO_LAZY_INIT=1`` (read when a group is
made); the feature sets it around the creation of every group after the world group (which
stays eager: a rank that cannot reach its peers fails at start-up). A value the user set
either way is kept.
"""

from __future__ import annotations

import os

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import CPU

FEATURE = feature(
    __name__,
    "CPU row: gloo process groups connect on first use, as NCCL's communicators do "
    "(TORCH_GLOO_LAZY_INIT around group creation)",
    aliases=("lazy_gloo_groups",), kept_out=("device",))


LAZY_INIT = "TORCH_GLOO_LAZY_INIT"


@hookimpl
def mmp_register_patches(registry):
    # every sub-group goes through it: new_group, new_subgroups(_by_enumeration), and
    # megatron-core's HyperCommGrid through those; init_process_group does not
    registry.add(
        FEATURE.patch(
            "new_group",
            "torch.distributed.distributed_c10d:_new_group_with_tag",
            "wrap",
            _lazily,
            devices=frozenset({CPU.name}),
            why="Megatron makes tens of groups and uses few; NCCL connects a group "
            "on its first collective, gloo now too",
            torch=VERIFIED,
        )
    )


def _lazily(wrapped, instance, args, kwargs):
    if LAZY_INIT in os.environ:
        return wrapped(*args, **kwargs)
    os.environ[LAZY_INIT] = "1"
    try:
        return wrapped(*args, **kwargs)
    finally:
        os.environ.pop(LAZY_INIT, None)
