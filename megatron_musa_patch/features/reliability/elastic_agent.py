"""The launcher's side of torch's elastic agent (``lib/elastic/agent.py``), in ``mmp run``'s
process and in dlrover-run's or ft_launcher's agent under ``MEGATRON_MUSA_PATCH=1``: before each
restart, which rank failed where and which checkpoint the group resumes from; a rank stopped as
a whole takes the agent's stop signal at once. Off: torchrun restarts and stops ranks as it
would; the paragraph at the end of a failed job stays."""

from __future__ import annotations

import functools

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.lib.elastic import agent
from megatron_musa_patch.lib.elastic.launchers import LAUNCHERS

FEATURE = feature(
    __name__,
    "launcher side: before each restart of the group, which rank failed where and the "
    "checkpoint it resumes from; a rank stopped as a whole (SIGSTOP) takes the stop signal at "
    "once instead of 30 s later")


@hookimpl
def mmp_register_launcher_patches(registry, supervision):
    for name, elastic in agent.ELASTIC.items():
        # the agent's private methods: torch's own (torch=), or nvidia-resiliency-ext's copy
        verified = {"torch": VERIFIED} if name == "torch" else {
            "distribution": LAUNCHERS["ft_launcher"].distribution}
        registry.add(FEATURE.patch(
            f"{name}.monitor", elastic.monitor, "wrap",
            functools.partial(agent.monitor, supervision),
            why="the agent's look at its workers, kept for the restart that may follow",
            **verified))
        registry.add(FEATURE.patch(
            f"{name}.restart", elastic.restart, "wrap",
            functools.partial(agent.restart, supervision),
            why="before a restart after failed ranks: who failed where, and the checkpoint the "
                "group resumes from", **verified))
        registry.add(FEATURE.patch(
            f"{name}.close", elastic.close, "wrap", functools.partial(agent.close, supervision),
            why="a rank stopped as a whole gets SIGCONT after the stop signal and takes it at "
                "once", **verified))
