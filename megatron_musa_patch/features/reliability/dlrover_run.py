"""dlrover-run under ``MEGATRON_MUSA_PATCH=1``: its agent gets ``mmp run``'s side of the job (the
reports before each restart and at the end, a fresh store per attempt), and its standalone
master starts on the torch releases whose SubprocessHandler requires ``numa_options``. Applied
in dlrover-run's agent process (``lib/elastic/launchers.py``)."""

from __future__ import annotations

import functools

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.elastic import launchers

FEATURE = feature(
    __name__,
    "launcher side: dlrover-run's agent reports which rank failed where and which checkpoint "
    "a restart resumes from, as mmp run does; its standalone master starts on torch >= 2.4")

LAUNCHER = launchers.LAUNCHERS["dlrover-run"]


@hookimpl
def mmp_register_launcher_patches(registry, supervision):
    registry.add(FEATURE.patch(
        "run", f"{LAUNCHER.module}:run", "wrap",
        functools.partial(launchers.run_supervised, LAUNCHER, supervision),
        distribution=LAUNCHER.distribution,
        why="the job runs under mmp run's supervision, named for dlrover-run"))
    registry.add(FEATURE.patch(
        "numa_options", f"{LAUNCHER.module}:SubprocessHandler", "wrap",
        launchers.subprocess_handler_with_numa_options, distribution=LAUNCHER.distribution,
        why="dlrover calls torch's SubprocessHandler with the six arguments of torch 2.3; newer "
            "torch requires numa_options (None: no NUMA binding)"))
