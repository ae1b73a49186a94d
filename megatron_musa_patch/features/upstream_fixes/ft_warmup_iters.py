"""``--enable-ft-package`` with the nvidia-resiliency-ext that installs beside megatron-core 0.16.

Megatron's fault-tolerance integration (``megatron/training/ft_integration.py``) starts its rank
monitor client with ``init_workload_monitoring(num_warmup_iters=...)`` (``--ft-num-warmup-iters``),
a parameter nvidia-resiliency-ext added after 0.4.1. 0.4.1 is the newest release whose wheels
install on a glibc older than 2.39 (0.6, which megatron-core 0.19 requires, needs 2.39), so every
rank failed at start-up with ``TypeError: ... unexpected keyword argument 'num_warmup_iters'``.

Where the installed client lacks the parameter, the fix calls it without: the warm-up iterations
then count towards the timeouts ``--calc-ft-timeouts`` computes (Megatron keeps them out of the
"step" section either way), which can only make those timeouts longer. With a client that takes
the parameter nothing changes.
"""

from __future__ import annotations

import importlib.util
import inspect

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--enable-ft-package with nvidia-resiliency-ext 0.4.1: its rank monitor client is started "
    "without num_warmup_iters, which it lacks")

NVRX = "nvidia_resiliency_ext"


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", "megatron.training.ft_integration:setup", "wrap", _setup,
        why="nvidia-resiliency-ext 0.4.1's RankMonitorClient takes no num_warmup_iters"))


def _setup(wrapped, instance, args, kwargs):
    client = _client_class_without_warmup_iters()
    if client is None:
        return wrapped(*args, **kwargs)
    original = client.__dict__["init_workload_monitoring"]

    def init_workload_monitoring(self, *a, num_warmup_iters=None, **kw):
        return original(self, *a, **kw)

    client.init_workload_monitoring = init_workload_monitoring
    try:
        return wrapped(*args, **kwargs)
    finally:
        client.init_workload_monitoring = original


def _client_class_without_warmup_iters():
    """nvidia-resiliency-ext's RankMonitorClient where the job enables the package and the
    client lacks the parameter; None otherwise (nothing is imported for a job without it)."""
    if importlib.util.find_spec(NVRX) is None:
        return None
    from megatron.training.arguments import parse_args

    if not getattr(parse_args(ignore_unknown_args=True), "enable_ft_package", False):
        return None
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    method = RankMonitorClient.__dict__.get("init_workload_monitoring")
    if method is None or "num_warmup_iters" in inspect.signature(method).parameters:
        return None
    return RankMonitorClient
