"""What the launcher's records do to torch's elastic agent (``features/reliability``).

* A rank stopped as a whole (SIGSTOP) keeps the agent's SIGTERM pending until it is continued:
  the agent waited 30 s for it, then killed it. After the stop signal it now also gets SIGCONT,
  so it takes the signal at once (a running process ignores SIGCONT). The job hears of each rank
  found stopped that way: continued, it looks like any other rank.
* Before each restart the agent would only log that it restarts: the job says which rank failed
  and where (the watchdog reports, ``reports.py``), and which checkpoint the group resumes from.

The implementations take the launcher's :class:`~.supervision.Supervision` first and do nothing
while it supervises no job, so their records can stay applied for the launcher process's life.
Torch's elastic package serves torchrun and dlrover-run's agent (which derives from it);
nvidia-resiliency-ext's ft_launcher runs a copy of it (``ELASTIC["nvrx"]``).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import signal
from typing import Dict

#: nvidia-resiliency-ext's copy of torch's elastic package
NVRX_ELASTIC = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat"


@dataclasses.dataclass(frozen=True)
class ElasticPackage:
    """Where one elastic package defines what the records wrap (the class that defines each
    method: LocalElasticAgent overrides ``_monitor_workers`` only)."""

    package: str
    #: the module of the agent class that defines ``_monitor_workers``
    local_agent: str

    @property
    def monitor(self) -> str:
        return f"{self.local_agent}:LocalElasticAgent._monitor_workers"

    @property
    def restart(self) -> str:
        return f"{self.package}.agent.server.api:SimpleElasticAgent._restart_workers"

    @property
    def close(self) -> str:
        return (f"{self.package}.multiprocessing.subprocess_handler.subprocess_handler:"
                f"SubprocessHandler.close")

    def child_failed(self) -> type:
        """What the launch raises when the job failed."""
        return importlib.import_module(f"{self.package}.multiprocessing.errors").ChildFailedError


ELASTIC: Dict[str, ElasticPackage] = {
    "torch": ElasticPackage("torch.distributed.elastic",
                            "torch.distributed.elastic.agent.server.local_elastic_agent"),
    # ft_launcher's agent derives from the copy's SimpleElasticAgent, its ranks start with the
    # copy's SubprocessHandler
    "nvrx": ElasticPackage(NVRX_ELASTIC, "nvidia_resiliency_ext.fault_tolerance.launcher"),
}


def stopped_as_a_whole(pid: int) -> bool:
    """The process is stopped (SIGSTOP) or held by a tracer (a debugger), as Linux's
    /proc/PID/stat says; False where there is no such file."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


def monitor(supervision, wrapped, instance, args, kwargs):
    """The agent's look at its workers, remembered for the restart that may follow."""
    result = wrapped(*args, **kwargs)
    job = supervision.job
    if job is not None:
        job.last_result = result
    return result


def restart(supervision, wrapped, instance, args, kwargs):
    """Before a restart that follows failed ranks (not one for a node joining): the rest of the
    group stopped first, as when no restart is left, so their reports hold what the stop signal
    found (the restart's own stop finds them ended); then the job's ``on_restart``."""
    job = supervision.job
    if job is None:
        return wrapped(*args, **kwargs)
    result, job.last_result = job.last_result, None
    # WorkerState by name: torch's and nvidia-resiliency-ext's copy have one each
    if result is not None and getattr(result.state, "name", "") in ("FAILED", "UNHEALTHY"):
        spec = instance._worker_group.spec
        instance._stop_workers(instance._worker_group)
        job.on_restart(dict(result.failures), spec.max_restarts - instance._remaining_restarts,
                       spec.max_restarts)
    return wrapped(*args, **kwargs)


def close(supervision, wrapped, instance, args, kwargs):
    """The stop signal, then SIGCONT: a rank stopped as a whole takes it at once."""
    job = supervision.job
    if job is None:
        return wrapped(*args, **kwargs)
    pid = getattr(getattr(instance, "proc", None), "pid", None)
    if pid is not None and stopped_as_a_whole(pid):
        job.on_frozen(pid)
    result = wrapped(*args, **kwargs)
    try:
        os.killpg(instance.proc.pid, signal.SIGCONT)
    except (ProcessLookupError, PermissionError, AttributeError):
        pass
    return result
