"""What the ranks' reports say about a failed attempt: which rank stopped, where, and which
error came first.

A rank whose exception reaches the top leaves an error report (``write_error``: its type, its
message and the time); :func:`first_error` picks the one that came first, passing over the lost
connections that a peer's failure causes on the other ranks.

A report (:func:`header`) names the last deadline the rank armed; after ``Timeout (``
follow its stacks, written when that deadline passed, or, without that line, the stacks it
wrote when the agent ended it (SIGTERM). The agent marks a rank it found stopped as a whole
(``mark_frozen``). Three kinds of rank come out of it:

* **hung**: its main thread was outside ``torch.distributed`` (a Python loop, I/O, a wait of its
  own) when its deadline passed, or when the agent ended it because its peers' deadlines had
  passed a moment before its own: this rank stopped the job;
* **waiting**: its deadline passed inside a collective: it was waiting for another rank. So did
  a rank whose main thread was in the watchdog itself: the collective it waited in had just
  failed (its peer ended at the same deadline), and it was cancelling its own;
* **frozen**: it had armed a deadline, the agent found it stopped (SIGSTOP, a debugger) or it
  wrote no stack when its peers gave up: it could not run Python (SIGSTOP, a debugger, stuck
  where Python cannot run).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from typing import Dict, List, Optional

#: the first line of a rank's report (the watchdog writes it with :func:`header`, :func:`read`
#: parses it); the stacks follow when the deadline passes
_HEADER = "mmp-watchdog rank={rank} pid={pid} timeout={timeout:g} where={where}\n"
_HEADER_LINE = re.compile(r"mmp-watchdog rank=(\d+) pid=(\d+) timeout=(\S+) where=(.*)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
#: how the watchdog's own module ends in a frame's path, wherever the package is installed
_WATCHDOG_PATH = f"{__package__}.watchdog".replace(".", os.sep) + ".py"


def header(rank: int, pid: int, timeout: float, where: str) -> str:
    """The first line of a rank's report: the deadline it armed last."""
    return _HEADER.format(rank=rank, pid=pid, timeout=timeout, where=where)


def report_file(report_dir: str, rank: int) -> str:
    """Where rank ``rank``'s watchdog writes its report."""
    return os.path.join(report_dir, f"rank{rank}.txt")


@dataclasses.dataclass(frozen=True)
class RankReport:
    rank: int
    pid: int
    timeout: float
    where: str
    #: the stacks written when the deadline passed, or when the agent ended the rank ("")
    stacks: str = ""
    #: the stacks are its watchdog's (its deadline passed), not the agent's stop signal's
    fired: bool = False
    #: the agent found the process stopped as a whole when it ended it
    frozen: bool = False

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
        when = "its hang watchdog fired" if self.fired else "it was stopped"
        return f"{launcher}: rank {self.rank}'s main thread when {when} (innermost first):\n" + \
            "\n".join(f"  {frame}" for frame in self.main_stack())

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

    def ended_outside_a_collective(self) -> bool:
        """The agent's signal, not its watchdog, ended it, and found it running Python outside
        a collective (the hung rank whose peers' deadlines passed first)."""
        return bool(self.stacks) and not (self.fired or self.frozen or self.was_waiting())

    def shows_where_it_stopped(self) -> bool:
        """Its stacks are from where it stopped making progress or waited: its watchdog's, or
        the stop signal's outside a collective; not a frozen rank's once continued."""
        return not self.frozen and (self.fired or self.ended_outside_a_collective())

    def innermost(self) -> str:
        frames = self.main_stack()
        return frames[0] if frames else "(no Python frame)"


def seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


#: the file ``mark_frozen`` leaves in the report directory, by pid
_FROZEN = "frozen-{pid}"


def mark_frozen(report_dir: Optional[str], pid: int) -> None:
    """The agent found this rank's process stopped as a whole when it ended it."""
    if report_dir and os.path.isdir(report_dir):
        open(os.path.join(report_dir, _FROZEN.format(pid=pid)), "w").close()


def read(report_dir: Optional[str]) -> Dict[int, RankReport]:
    found: Dict[int, RankReport] = {}
    if not report_dir or not os.path.isdir(report_dir):
        return found
    names = sorted(os.listdir(report_dir))
    for name in names:
        try:
            with open(os.path.join(report_dir, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        first, _, rest = text.partition("\n")
        match = _HEADER_LINE.match(first)
        if not match:
            continue
        fired = "Timeout (" in rest
        stacks = rest[rest.find("Timeout ("):] if fired else rest.strip()
        pid = int(match.group(2))
        found[int(match.group(1))] = RankReport(
            int(match.group(1)), pid, float(match.group(3)), match.group(4), stacks, fired,
            frozen=_FROZEN.format(pid=pid) in names)
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
    # found stopped as a whole: whatever it wrote once the agent continued it to take the stop
    # signal (its watchdog's deadline had long passed by then) is not where it hung
    marked = [r for r in reports.values() if r.frozen]
    fired = [r for r in reports.values() if r.fired and not r.frozen]
    if not fired:
        return None
    hung = [r for r in fired if not r.was_waiting()]
    waiting = [r for r in fired if r.was_waiting()]
    # still running when its peers gave up, until the agent stopped it
    stopped = [r for r in reports.values() if not r.fired and not r.frozen
               and exit_codes.get(r.rank, -signal.SIGTERM) == -signal.SIGTERM]
    # its peers' deadlines passed a moment before its own: where the agent's signal found it
    late = [r for r in stopped if r.ended_outside_a_collective()]
    # no stack even from the stop signal: it could not run at all
    frozen = marked + [r for r in stopped if not r.stacks]
    parts = []
    for r in sorted(hung, key=lambda r: r.rank):
        parts.append(f"rank {r.rank} (pid {r.pid}) made no progress for {seconds(r.timeout)} s in the "
                     f"{r.where} and was ended by its hang watchdog; it was at "
                     f"{r.innermost()} (its stack is printed above)")
    if not hung:
        for r in sorted(late, key=lambda r: r.rank):
            parts.append(f"rank {r.rank} (pid {r.pid}) made no progress in the {r.where} and was "
                         f"stopped when its peers' watchdogs had given up waiting for it, before "
                         f"its own deadline passed; it was at {r.innermost()} (its stack is "
                         f"printed above)")
    if not hung and not late:
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




# ----------------------------------------------------------------------------- start-up

#: a rank leaves this once it says what it does itself (the launcher's progress lines stop)
_STARTED = "rank-started"
#: the launcher leaves the time of its last line here (a rank's progress lines go on from it)
_LAUNCHER_SAID = "launcher-said"


def launcher_said(report_dir: Optional[str], wall: float) -> None:
    if report_dir and os.path.isdir(report_dir):
        with open(os.path.join(report_dir, _LAUNCHER_SAID), "w", encoding="utf-8") as f:
            f.write(repr(wall))


def launcher_last_line(report_dir: Optional[str]) -> Optional[float]:
    """When the launcher last printed a line (``time.time()``), if it said."""
    try:
        with open(os.path.join(report_dir or "", _LAUNCHER_SAID), encoding="utf-8") as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def mark_rank_started(report_dir: Optional[str]) -> None:
    if report_dir and os.path.isdir(report_dir):
        try:
            open(os.path.join(report_dir, _STARTED), "w").close()
        except OSError:
            pass


def rank_started(report_dir: Optional[str]) -> bool:
    return bool(report_dir) and os.path.exists(os.path.join(report_dir, _STARTED))


def forget_attempt(report_dir: Optional[str]) -> None:
    """Forget what an earlier job left in a report directory that outlives jobs (one the user
    set): its errors would be taken for this job's."""
    if report_dir and os.path.isdir(report_dir):
        for name in os.listdir(report_dir):
            if name.startswith("error-rank") or name in (_STARTED, _LAUNCHER_SAID):
                try:
                    os.unlink(os.path.join(report_dir, name))
                except OSError:
                    pass


# ----------------------------------------------------------------------------- errors

#: how a rank's error report is named in the report directory
_ERROR = "error-rank{rank}-{pid}.json"
#: what a rank says when a peer's process or process group went away: it follows another
#: rank's failure (gloo, NCCL/MCCL, the c10d store, the OS), it is not one of its own
_LOST_CONNECTION = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|connection refused|Socket Timeout|"
    r"communicator was aborted|NCCL error|MCCL error|remote process exited|recvValue|"
    r"failed to recv|Connection closed|DistNetworkError|peer .* closed", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """The exception that ended a rank, as the rank said it when it reached the top."""

    rank: int
    pid: int
    #: ``time.time()`` when the rank reported it
    time: float
    kind: str
    message: str
    #: the attempt it belongs to (torchelastic's restart count): a restart with no launcher
    #: record to clear the directory between attempts leaves the earlier ones' reports there
    attempt: int = 0

    def lost_connection(self) -> bool:
        return self.kind in ("DistNetworkError", "DistBackendError") or bool(
            _LOST_CONNECTION.search(self.message))

    def said(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        text = f"{self.kind}: {first}" if first else self.kind
        return text if len(text) <= 160 else text[:157] + "..."


def write_error(report_dir: Optional[str], rank: int, exc: BaseException) -> None:
    """Leave ``exc`` in the report directory (``mmp run`` reads it to say who failed first)."""
    if not report_dir or not os.path.isdir(report_dir):
        return
    import json
    import time

    report = {"rank": rank, "pid": os.getpid(), "time": time.time(),
              "kind": type(exc).__name__, "message": str(exc)[:2000],
              "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)}
    path = os.path.join(report_dir, _ERROR.format(rank=rank, pid=os.getpid()))
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def read_errors(report_dir: Optional[str]) -> Dict[int, ErrorReport]:
    """The ranks' error reports of the latest attempt, the first per rank."""
    import json

    reports: List[ErrorReport] = []
    if not report_dir or not os.path.isdir(report_dir):
        return {}
    for name in sorted(os.listdir(report_dir)):
        if not (name.startswith("error-rank") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(report_dir, name), encoding="utf-8") as f:
                reports.append(ErrorReport(**json.load(f)))
        except (OSError, ValueError, TypeError):
            continue
    latest = max((r.attempt for r in reports), default=0)
    found: Dict[int, ErrorReport] = {}
    for report in reports:
        if report.attempt == latest and (report.rank not in found or
                                         report.time < found[report.rank].time):
            found[report.rank] = report
    return found


def first_error(errors: Dict[int, ErrorReport]) -> Optional[ErrorReport]:
    """The error that came first: the earliest that is not a lost connection (a peer's failure
    shows as one on every other rank, sometimes before the failing rank reports its own), else
    the earliest."""
    if not errors:
        return None
    own = [e for e in errors.values() if not e.lost_connection()]
    return min(own or errors.values(), key=lambda e: (e.time, e.rank))


__all__ = ["header", "report_file", "RankReport", "read", "clear", "mark_frozen", "diagnosis",
           "ErrorReport", "write_error", "read_errors", "first_error", "launcher_said",
           "launcher_last_line", "mark_rank_started", "rank_started", "forget_attempt"]
