"""nvidia-resiliency-ext's ft_launcher under ``MEGATRON_MUSA_PATCH=1``: its agent runs the job
under ``mmp run``'s supervision (a fresh store per attempt, the paragraph of who failed where at
the end; the reports before each restart are ``reliability.elastic_agent``'s). Applied in
ft_launcher's agent process (``lib/elastic/launchers.py``)."""

from __future__ import annotations

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.elastic import launchers

from . import supervised_run

FEATURE = feature(
    __name__,
    "launcher side: ft_launcher's agent runs the job under mmp run's supervision (a fresh store "
    "per attempt, who failed where and the checkpoint to resume from)")

LAUNCHER = launchers.LAUNCHERS["ft_launcher"]


@hookimpl
def mmp_register_launcher_patches(registry, supervision):
    registry.add(supervised_run(FEATURE, LAUNCHER, supervision))
