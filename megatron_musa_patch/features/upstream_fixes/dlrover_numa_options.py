"""dlrover-run's standalone master starts on the supported torch releases: dlrover 0.6.1 calls
torch's SubprocessHandler with the six arguments of torch 2.3, and torch since then requires a
seventh, ``numa_options`` (``dlrover-run --standalone`` failed with a TypeError). A record of the
launcher's process (dlrover-run's agent under ``MEGATRON_MUSA_PATCH=1``); required, as dlrover-run
does not start without it."""

from __future__ import annotations

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.elastic import launchers

FEATURE = feature(
    __name__,
    "launcher side: dlrover-run's standalone master starts on torch >= 2.4 (numa_options)",
    required=True)

LAUNCHER = launchers.LAUNCHERS["dlrover-run"]


@hookimpl
def mmp_register_launcher_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{LAUNCHER.module}:SubprocessHandler", "wrap",
        launchers.subprocess_handler_with_numa_options, distribution=LAUNCHER.distribution,
        why="dlrover calls torch's SubprocessHandler with the six arguments of torch 2.3; newer "
            "torch requires numa_options (None: no NUMA binding)"))
