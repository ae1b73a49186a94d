"""``mmp run``'s side of torch's elastic agent, for as long as it drives one.

* A rank stopped as a whole (SIGSTOP) keeps the agent's SIGTERM pending until it is continued:
  the agent waited 30 s for it, then killed it. After the stop signal it now also gets SIGCONT,
  so it takes the signal at once (a running process ignores SIGCONT). ``on_frozen(pid)`` hears
  of each rank found stopped that way: continued, it looks like any other rank.
* Before each restart the agent would only log that it restarts: ``mmp run`` says which rank
  failed and where (the watchdog reports, ``reports.py``), and which checkpoint the group resumes
  from.

The wrappers are installed on the agent's classes inside the ``driven`` context and removed
after: torch's (torchrun, dlrover-run's agent derives from them), or the copy of torch's elastic
package that nvidia-resiliency-ext's ft_launcher runs (``Elastic.nvrx``).
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import wrapt

#: verified on these torch releases (the agent's private methods are wrapped)
VERIFIED_TORCH = ">=2.11,<2.16"


#: nvidia-resiliency-ext's copy of torch's elastic package, verified with its release 0.4.1
NVRX_ELASTIC = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat"


@dataclass(frozen=True)
class Elastic:
    """The classes of one elastic package an agent runs on."""

    api: object  # the module of WorkerState and SimpleElasticAgent (which has _restart_workers)
    local_agent: type  # the agent class that defines _monitor_workers
    subprocess_handler: type
    child_failed: type  # what the launch raises when the job failed

    @classmethod
    def torch(cls) -> "Elastic":
        from torch.distributed.elastic.agent.server import api
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            subprocess_handler)

        return cls(api, LocalElasticAgent, subprocess_handler.SubprocessHandler,
                   ChildFailedError)

    @classmethod
    def nvrx(cls) -> "Elastic":
        """ft_launcher's: its agent (``fault_tolerance.launcher.LocalElasticAgent``) derives from
        the copy's SimpleElasticAgent and starts ranks with the copy's SubprocessHandler."""
        import importlib

        from nvidia_resiliency_ext.fault_tolerance.launcher import LocalElasticAgent

        api = importlib.import_module(f"{NVRX_ELASTIC}.agent.server.api")
        errors = importlib.import_module(f"{NVRX_ELASTIC}.multiprocessing.errors")
        handler = importlib.import_module(
            f"{NVRX_ELASTIC}.multiprocessing.subprocess_handler.subprocess_handler")
        return cls(api, LocalElasticAgent, handler.SubprocessHandler, errors.ChildFailedError)


def stopped_as_a_whole(pid: int) -> bool:
    """The process is stopped (SIGSTOP) or held by a tracer (a debugger), as Linux's
    /proc/PID/stat says; False where there is no such file."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


@contextmanager
def driven(on_restart: Callable[[Dict[int, object], int, int], None],
           elastic: Optional[Elastic] = None,
           on_frozen: Optional[Callable[[int], None]] = None):
    """While the context is open, ``on_restart(failures, restart, max_restarts)`` runs before a
    restart that follows failed ranks (not one for a node joining), and ``on_frozen(pid)`` when
    the agent ends a rank it finds stopped as a whole."""
    elastic = elastic or Elastic.torch()
    api = elastic.api

    last: Dict[str, Optional[object]] = {"result": None}

    def monitor(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        last["result"] = result
        return result

    def restart(wrapped, instance, args, kwargs):
        result = last["result"]
        if result is not None and result.state in (api.WorkerState.FAILED,
                                                    api.WorkerState.UNHEALTHY):
            spec = instance._worker_group.spec
            # the rest of the group stopped first, as when no restart is left: their reports
            # then hold what the stop signal found (the restart's own stop finds them ended)
            instance._stop_workers(instance._worker_group)
            on_restart(dict(result.failures), spec.max_restarts - instance._remaining_restarts,
                       spec.max_restarts)
        last["result"] = None
        return wrapped(*args, **kwargs)

    def close(wrapped, instance, args, kwargs):
        pid = getattr(getattr(instance, "proc", None), "pid", None)
        if on_frozen is not None and pid is not None and stopped_as_a_whole(pid):
            on_frozen(pid)
        result = wrapped(*args, **kwargs)
        try:
            os.killpg(instance.proc.pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError, AttributeError):
            pass
        return result

    # where each method is defined (LocalElasticAgent overrides _monitor_workers only)
    targets = [(elastic.local_agent, "_monitor_workers", monitor),
               (api.SimpleElasticAgent, "_restart_workers", restart),
               (elastic.subprocess_handler, "close", close)]
    saved = []
    for owner, name, impl in targets:
        original = owner.__dict__[name]
        saved.append((owner, name, original))
        setattr(owner, name, wrapt.FunctionWrapper(original, impl))
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
