"""A rank that stops making progress ends itself, with its stack, so the elastic agent can
restart the group.

The engine is the standard library's ``faulthandler.dump_traceback_later(..., exit=True)``: a C
thread that, when the deadline passes, writes every Python thread's stack and exits the process
with status 1, whatever the main thread is doing (a Python loop, a wait inside a collective or
in I/O). torchrun's own timer server (``TORCHELASTIC_ENABLE_FILE_TIMER``) is not used: when it
reaps a worker it also kills the agent it runs in (torch/distributed/elastic/timer/
file_based_local_timer.py, "Terminating the server process"), which ends the job instead of
restarting it.

A rank that is frozen as a whole (SIGSTOP, a debugger) cannot run its watchdog either: its peers,
waiting for it in a collective, reach their deadlines instead; its report then shows the last
deadline it armed and no stack, and the agent finds it stopped when it ends it.

A rank hung in Python whose peers' equal deadlines passed a moment before its own is ended by
the agent's SIGTERM before its watchdog fires: faulthandler writes its stacks into the report
on that signal too (then the process ends as it would have), so the launcher still sees where
it was.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import time
from contextlib import contextmanager
from typing import Dict, Optional, TextIO

from . import reports

#: the first training step compiles and warms up: it does not set later steps' deadlines
WARM_UP_KIND = "step"


@dataclasses.dataclass
class Deadlines:
    """Seconds a section of a kind may take: the first of its kind ``first`` (warm-up, a first
    save), later ones ``timeout`` or ``factor`` times the slowest seen, whichever is longer."""

    timeout: float
    first: float
    factor: float = 2.0
    seen: Dict[str, int] = dataclasses.field(default_factory=dict)
    slowest: Dict[str, float] = dataclasses.field(default_factory=dict)

    def allowed(self, kind: str) -> float:
        if not self.seen.get(kind):
            return max(self.first, self.timeout)
        return max(self.timeout, self.factor * self.slowest.get(kind, 0.0))

    def finished(self, kind: str, seconds: float) -> None:
        count = self.seen.get(kind, 0)
        self.seen[kind] = count + 1
        if kind == WARM_UP_KIND and count == 0:
            return
        self.slowest[kind] = max(self.slowest.get(kind, 0.0), seconds)


class Watchdog:
    """Arms one deadline at a time (faulthandler has one). ``report`` is the rank's report
    file (a header per deadline, then the stack), or None to write stacks to stderr."""

    def __init__(self, deadlines: Deadlines, rank: int, report: Optional[TextIO] = None):
        self.deadlines = deadlines
        self.rank = rank
        self.report = report
        self.in_loop = False

    @classmethod
    def for_rank(cls, deadlines: Deadlines, rank: int, report_dir: Optional[str]) -> "Watchdog":
        report = None
        if report_dir:
            report = open(reports.report_file(report_dir, rank), "w", encoding="utf-8")
            # after the header of the deadline armed last; chain: SIGTERM still ends the rank
            faulthandler.register(signal.SIGTERM, file=report, all_threads=True, chain=True)
        return cls(deadlines, rank, report)

    def arm(self, seconds: float, where: str) -> None:
        if self.report is not None:
            self.report.seek(0)
            self.report.write(reports.header(self.rank, os.getpid(), seconds, where))
            self.report.truncate()
            self.report.flush()
            faulthandler.dump_traceback_later(seconds, exit=True, file=self.report)
        else:
            faulthandler.dump_traceback_later(seconds, exit=True)

    def cancel(self) -> None:
        faulthandler.cancel_dump_traceback_later()

    @contextmanager
    def section(self, kind: str, where: str):
        """The deadline of one section; after it, the loop's deadline for reaching the next
        one (``timeout``), or none outside the training loop. An exception cancels it: the
        rank is failing on its own and reports why."""
        self.arm(self.deadlines.allowed(kind), where)
        start = time.monotonic()
        try:
            yield
        except BaseException:
            self.cancel()
            raise
        self.deadlines.finished(kind, time.monotonic() - start)
        if self.in_loop:
            self.arm(self.deadlines.timeout, f"after the {where}, before the next step")
        else:
            self.cancel()
