"""The launcher's side of a job while an elastic agent runs it in this process: ``mmp run``'s
torchrun, and dlrover-run's or ft_launcher's agent under ``MEGATRON_MUSA_PATCH=1``.

:func:`supervised` gives each attempt a fresh store, collects the ranks' hang watchdog reports
in a directory and says them before each restart, and when the job fails prints who failed
where and which checkpoint to resume from (``failure_report``). What it needs from inside the
agent (a restart about to happen, a rank found stopped) comes from the launcher's records
(``agent.py``), which read the :class:`Supervision` handed to them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, List, Optional

from megatron_musa_patch.base.env_names import WATCHDOG_DIR_ENV
from megatron_musa_patch.lib.heartbeat import Heartbeat, say

from . import reports
from .agent import ELASTIC
from .failure_report import failure_report

#: torch's switch for a store per attempt (pytorch/pytorch#135712: with the store torchrun shares
#: across attempts, a restarted group can read the previous attempt's addresses and never
#: connect; ``features/reliability/restart_store.py`` covers plain torchrun on one node)
FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
#: the launcher says what it is doing while the ranks start, until this long after its start (a
#: node whose ranks never say they are up, with the layer's progress feature off, stays quiet
#: after it)
STARTING_MOST_S = 300.0


@dataclasses.dataclass
class Job:
    """The job being supervised, as the agent's records see it."""

    #: ``on_restart(failures, restart, max_restarts)`` before a restart that follows failed ranks
    on_restart: Callable[[Dict[int, Any], int, int], None]
    #: ``on_frozen(pid)`` when the agent ends a rank it found stopped as a whole
    on_frozen: Callable[[int], None]
    #: the agent's last look at its workers (``agent.monitor``)
    last_result: Any = None


@dataclasses.dataclass
class Supervision:
    """The launcher process's state: the job it supervises now (None: the records pass
    through)."""

    job: Optional[Job] = None


@contextmanager
def supervised(supervision: Supervision, script_args: List[str], max_restarts: int,
               launcher: str = "mmp run", restarter: str = "torchrun", elastic: str = "torch",
               heartbeat: Optional[Heartbeat] = None):
    """The launcher's side of one job (the agent runs it inside the context); ``elastic``: the
    elastic package its agent runs on (``agent.ELASTIC``). A failed job's ChildFailedError is
    re-raised after its paragraph."""
    child_failed = ELASTIC[elastic].child_failed()
    os.environ.setdefault(FRESH_STORE_ENV, "1")
    own_dir = not os.environ.get(WATCHDOG_DIR_ENV)
    if own_dir:
        os.environ[WATCHDOG_DIR_ENV] = tempfile.mkdtemp(prefix="mmp-watchdog-")
    report_dir = os.environ[WATCHDOG_DIR_ENV]
    said = dict(launcher=launcher, restarter=restarter)

    def on_restart(failures, restart, most):
        stop_leftovers(failure.pid for failure in failures.values())
        print(failure_report(failures, script_args, reports.read(report_dir),
                             restart=(restart, most), errors=reports.read_errors(report_dir),
                             **said), file=sys.stderr, flush=True)
        reports.clear(report_dir)

    reports.forget_attempt(report_dir)  # a directory of the user's may hold an earlier job's
    # the launcher's progress lines go on until this node's first rank is up (rank 0 then says
    # what it does itself: features/logs/startup_progress.py), for a few minutes at most
    starting = heartbeat or Heartbeat(say, None)
    starting.describe = lambda elapsed: (f"{launcher}: the ranks are starting (each imports "
                                         f"torch and Megatron; {elapsed:.0f} s)")
    starting.until = lambda: reports.rank_started(report_dir)
    starting.most_s = STARTING_MOST_S
    reports.launcher_said(report_dir, starting.last_output())
    starting.start()
    supervision.job = Job(on_restart, lambda pid: reports.mark_frozen(report_dir, pid))
    try:
        with starting:
            yield
    except child_failed as exc:
        stop_leftovers(failure.pid for failure in exc.failures.values())
        print(failure_report(exc.failures, script_args, reports.read(report_dir),
                             max_restarts=max_restarts, errors=reports.read_errors(report_dir),
                             **said), file=sys.stderr, flush=True)
        raise
    finally:
        supervision.job = None
        if own_dir:
            shutil.rmtree(report_dir, ignore_errors=True)
            os.environ.pop(WATCHDOG_DIR_ENV, None)


def stop_leftovers(rank_pids, grace_s: float = 5.0) -> List[int]:
    """Stop what a dead rank left running. torchrun starts each rank as the leader of its own
    process group and, on failure, signals the groups of the ranks still alive, not of the dead
    one: the children of a rank killed from outside -- megatron-core's checkpoint writer starts a
    multiprocessing Manager -- then live on forever, holding the job's stdout open (a `| tee`
    never ends). Returns the groups that had to be signalled."""
    signalled = []
    for pid in set(rank_pids):
        if not pid or pid <= 0:
            continue
        try:
            os.killpg(pid, signal.SIGTERM)  # a group id is not reused while it has members
        except (ProcessLookupError, PermissionError):
            continue
        signalled.append(pid)
    deadline = time.monotonic() + grace_s
    for pid in signalled:
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.1)
        if _group_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return signalled


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
