"""``destroy_model_parallel`` releases the process groups ``initialize_model_parallel`` made.

Upstream's ``destroy_model_parallel`` forgets its groups (the module globals go back to None)
but destroys only the gloo ones it made on purpose; every other group stays registered with
torch.distributed for the rest of the process. With NCCL that costs little: a communicator is
made on a group's first collective. On the CPU row every group is a gloo group, served by
threads of its own and connected to its peers (when made, or on first use under
``device.lazy_gloo_groups``), so a process that initialises and destroys model parallelism repeatedly
(upstream's unit tests do it before every test; so do sweeps and tools that re-shard) piles up
sockets and threads, and each later initialisation is slower than the last: measured on 8 ranks
and 2 cores, the 10 tests of ``moe/test_aux_loss.py::TestAuxLoss`` took 165 s, the last of them
80 s.

The fix remembers the groups each ``initialize_model_parallel`` registered and destroys those
still registered once ``destroy_model_parallel`` has run. A group a caller kept from before the
destroy is then gone, as the gloo groups upstream destroys already are; switch the feature off
(``MEGATRON_MUSA_PATCH_DISABLE=device.release_dropped_groups``) to keep upstream's behaviour.
"""

from __future__ import annotations

import functools

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import CPU

FEATURE = feature(
    __name__,
    "destroy_model_parallel destroys the gloo groups initialize_model_parallel made (CPU row), "
    "instead of leaving their sockets and threads behind",
    aliases=("release_dropped_groups",), kept_out=("device",))


PARALLEL_STATE = "megatron.core.parallel_state"


class ModelParallelGroups:
    """The process groups registered by the ``initialize_model_parallel`` calls since the last
    ``destroy_model_parallel``."""

    def __init__(self):
        self.made = []

    def record_initialize(self, wrapped, instance, args, kwargs):
        before = set(_registered())
        try:
            return wrapped(*args, **kwargs)
        finally:  # a failed initialisation leaves its groups behind too
            self.made.extend(group for group in _registered() if group not in before)

    def release_on_destroy(self, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        import torch.distributed as dist

        made, self.made = self.made, []
        if not dist.is_initialized():
            return result
        registered = _registered()
        for group in made:
            if group in registered and group is not dist.GroupMember.WORLD:
                dist.destroy_process_group(group)
        return result


def _registered():
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.pg_map


@hookimpl
def mmp_register_patches(registry):
    groups = ModelParallelGroups()
    # torch=: it reads torch's private registry of process groups (distributed_c10d._world)
    record = functools.partial(FEATURE.patch, devices=frozenset({CPU.name}), torch=VERIFIED)
    registry.add(record("initialize", f"{PARALLEL_STATE}:initialize_model_parallel",
                        "wrap", groups.record_initialize,
                        why="remember the groups it registers, to destroy them with it"))
    registry.add(record("destroy", f"{PARALLEL_STATE}:destroy_model_parallel",
                        "wrap", groups.release_on_destroy,
                        why="a dropped gloo group keeps its sockets and threads: each later "
                            "initialisation slows down"))
