"""What the ranks' watchdog reports say about a failed attempt: which rank stopped, where.

A report (``watchdog.HEADER``) names the last deadline the rank armed; after ``Timeout (``
follow its stacks, written when that deadline passed. Three kinds of rank come out of it:

* **hung**: its deadline passed while its main thread was outside ``torch.distributed`` (a
  Python loop, I/O, a wait of its own): this rank stopped the job;
* **waiting**: its deadline passed inside a collective: it was waiting for another rank. So did
  a rank whose main thread was in the watchdog itself: the collective it waited in had just
  failed (its peer ended at the same deadline), and it was cancelling its own;
* **frozen**: it had armed a deadline and neither reported nor exited when its peers did: it
  could not run its watchdog (SIGSTOP, a debugger, stuck where Python cannot run).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from typing import Dict, List, Optional

from . import watchdog
from .watchdog import HEADER

_HEADER = re.compile(r"mmp-watchdog rank=(\d+) pid=(\d+) timeout=(\S+) where=(.*)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
#: how the watchdog's own module ends in a frame's path, wherever the package is installed
_WATCHDOG_PATH = watchdog.__name__.replace(".", os.sep) + ".py"


@dataclasses.dataclass(frozen=True)
class RankReport:
    rank: int
    pid: int
    timeout: float
    where: str
    #: the stacks written when the deadline passed ("" while it had not)
    stacks: str = ""

    @property
    def fired(self) -> bool:
        return bool(self.stacks)

    def main_stack(self) -> List[str]:
        """The frames of the main thread, innermost first (the thread whose outermost frame is
        not threading's bootstrap)."""
        blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", self.stacks)
        for block in blocks:
            frames = [m.group(0) for m in _FRAME.finditer(block)]
            if frames and "threading.py" not in frames[-1]:
                return frames
        return []

    def main_stack_text(self, launcher: str = "mmp run") -> str:
        return f"{launcher}: rank {self.rank}'s main thread when its hang watchdog fired " \
               f"(innermost first):\n" + "\n".join(f"  {frame}" for frame in self.main_stack())

    def in_collective(self) -> bool:
        return any(f"{os.sep}torch{os.sep}distributed{os.sep}" in frame
                   for frame in self.main_stack()[:8])

    def in_watchdog(self) -> bool:
        frames = self.main_stack()
        match = _FRAME.match(frames[0]) if frames else None
        return bool(match) and match.group(1).endswith(_WATCHDOG_PATH)

    def was_waiting(self) -> bool:
        """Its deadline passed while it waited for another rank (the module's docstring)."""
        return self.in_collective() or self.in_watchdog()

    def innermost(self) -> str:
        frames = self.main_stack()
        return frames[0] if frames else "(no Python frame)"


def seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def read(report_dir: Optional[str]) -> Dict[int, RankReport]:
    found: Dict[int, RankReport] = {}
    if not report_dir or not os.path.isdir(report_dir):
        return found
    for name in sorted(os.listdir(report_dir)):
        try:
            with open(os.path.join(report_dir, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        first, _, rest = text.partition("\n")
        match = _HEADER.match(first)
        if not match:
            continue
        stacks = rest[rest.find("Timeout ("):] if "Timeout (" in rest else ""
        found[int(match.group(1))] = RankReport(int(match.group(1)), int(match.group(2)),
                                                float(match.group(3)), match.group(4), stacks)
    return found


def clear(report_dir: Optional[str]) -> None:
    """Forget an attempt's reports before the next attempt writes its own."""
    if report_dir and os.path.isdir(report_dir):
        for name in os.listdir(report_dir):
            try:
                os.unlink(os.path.join(report_dir, name))
            except OSError:
                pass


def diagnosis(reports: Dict[int, RankReport], exit_codes: Dict[int, int]) -> Optional[str]:
    """The sentences that say which rank stopped making progress and where, or None when no
    watchdog fired (a rank died or failed on its own: the exit statuses say it).
    ``exit_codes``: the ranks the agent saw end, with their codes (-15: it stopped them)."""
    fired = [r for r in reports.values() if r.fired]
    if not fired:
        return None
    hung = [r for r in fired if not r.was_waiting()]
    waiting = [r for r in fired if r.was_waiting()]
    # still running when its peers gave up, until the agent stopped it
    frozen = [r for r in reports.values() if not r.fired
              and exit_codes.get(r.rank, -signal.SIGTERM) == -signal.SIGTERM]
    parts = []
    for r in sorted(hung, key=lambda r: r.rank):
        parts.append(f"rank {r.rank} (pid {r.pid}) made no progress for {seconds(r.timeout)} s in the "
                     f"{r.where} and was ended by its hang watchdog; it was at "
                     f"{r.innermost()} (its stack is printed above)")
    if not hung:
        for r in sorted(frozen, key=lambda r: r.rank):
            parts.append(f"rank {r.rank} (pid {r.pid}) stopped in the {r.where} and did not "
                         f"answer its hang watchdog: it was frozen (stopped by a signal such as "
                         f"SIGSTOP, held by a debugger, or stuck where Python cannot run)")
    if waiting:
        ranks = ", ".join(str(r.rank) for r in sorted(waiting, key=lambda r: r.rank))
        timeout = max(r.timeout for r in waiting)
        parts.append(f"rank{'s' if len(waiting) > 1 else ''} {ranks} waited for "
                     f"{'it' if len(parts) == 1 else 'them' if parts else 'each other'} in a "
                     f"collective for {seconds(timeout)} s and ended "
                     f"{'themselves' if len(waiting) > 1 else 'itself'}")
    return "; ".join(parts) + "."


__all__ = ["HEADER", "RankReport", "read", "clear", "diagnosis"]
