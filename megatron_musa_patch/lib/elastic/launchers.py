"""Launchers other than torchrun whose agent gets ``mmp run``'s side through the start-up hook
(``MEGATRON_MUSA_PATCH=1``): what their records wrap and with what (``features/reliability``).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Dict

from . import supervision as supervision_module


@dataclasses.dataclass(frozen=True)
class Launcher:
    name: str  # as it says itself in the reports
    module: str  # the module whose ``run(args)`` parses nothing more and runs the agent
    elastic: str  # the elastic package its agent runs on (``agent.ELASTIC``)
    #: the launcher's package and the releases its records were verified with
    distribution: str


LAUNCHERS: Dict[str, Launcher] = {
    "dlrover-run": Launcher("dlrover-run", "dlrover.trainer.torch.elastic_run", "torch",
                            "dlrover==0.6.1"),
    "ft_launcher": Launcher("ft_launcher", "nvidia_resiliency_ext.fault_tolerance.launcher",
                            "nvrx", "nvidia-resiliency-ext==0.4.1"),
}


def run_supervised(launcher: Launcher, supervision, wrapped, instance, args, kwargs):
    """The launcher's ``run(args)`` inside :func:`~.supervision.supervised`, named for it."""
    parsed = args[0] if args else kwargs["args"]
    with supervision_module.supervised(
            supervision, list(parsed.training_script_args), parsed.max_restarts,
            launcher=f"mmp ({launcher.name})", restarter=launcher.name,
            elastic=launcher.elastic):
        return wrapped(*args, **kwargs)


def subprocess_handler_with_numa_options(wrapped, instance, args, kwargs):
    """dlrover 0.6.1 starts its standalone master with torch's SubprocessHandler as torch 2.3
    called it, six arguments; torch since then requires a seventh, numa_options, and
    ``dlrover-run --standalone`` failed with a TypeError. None: no NUMA binding."""
    if len(args) == 6 and "numa_options" not in kwargs and \
            "numa_options" in inspect.signature(wrapped).parameters:
        kwargs = dict(kwargs, numa_options=None)
    return wrapped(*args, **kwargs)
