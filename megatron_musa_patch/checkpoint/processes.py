"""A conversion's processes: every process a step starts (torchrun's agent, its ranks, which
torchrun puts in sessions of their own, Megatron's checkpoint writers) is stopped with the step,
whether the step ends, fails, has a process killed, or ``mmp checkpoint`` itself is
interrupted. ``mmp checkpoint`` makes itself their subreaper (Linux's
``PR_SET_CHILD_SUBREAPER``): a process whose parent dies is handed to it rather than to init, so
none escapes the stop, which signals every descendant. SIGINT, SIGTERM or SIGHUP to ``mmp
checkpoint`` become ``Interrupted``, so that what the conversion wrote is removed on the way
out (its ``finally`` blocks run) before it exits with 128 + the signal. A step runs in a session
of its own: a Ctrl-C at the terminal reaches ``mmp checkpoint`` alone, which stops the rest."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Set

#: the signals that end a conversion early
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: how long a step's processes have to end after SIGTERM before SIGKILL
GRACE_S = 5.0
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


class Interrupted(Exception):
    """``mmp checkpoint`` got one of ``STOPPING``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


@contextlib.contextmanager
def interruptible():
    """Within: the first of ``STOPPING`` raises ``Interrupted`` (later ones are ignored while
    the conversion cleans up); the handlers before are restored on the way out."""

    def handler(signum, frame):
        for sig in STOPPING:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOPPING}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


@contextlib.contextmanager
def uninterrupted():
    """Within: ``STOPPING`` signals wait (blocked) until the end, so that stopping a step or
    removing what a conversion wrote is never cut short; one that came meanwhile is delivered
    on the way out. (No process is started within: it would inherit the blocked signals.)"""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def run(cmd: List[str], env: dict) -> int:
    """``cmd`` in a session of its own; its exit status once it and every process it started
    have ended (what is left of them when it ends is stopped then)."""
    _become_subreaper()
    # not started with the signals blocked: a child inherits the mask, and the step's processes
    # must take SIGTERM
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait()
    finally:
        with uninterrupted():
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the step and every process it started, SIGKILL to those left after
    ``GRACE_S``; returns once they have ended and been reaped."""
    if proc.poll() is None:
        proc.terminate()  # the step itself, whether or not /proc shows what it started
    if not _signal(descendants(os.getpid()), signal.SIGTERM):
        proc.wait()
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _running(descendants(os.getpid())):
        _reap(proc)
        time.sleep(0.05)
    _signal(descendants(os.getpid()), signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and descendants(os.getpid()):
        _reap(proc)
        time.sleep(0.05)


def descendants(root: int) -> Set[int]:
    """Every process below ``root`` (from /proc; none where there is no /proc)."""
    children = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pids: Set[int]) -> bool:
    """Whether any of ``pids`` has not ended (a zombie has)."""
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                return True
        except OSError:
            continue
    return False


def _signal(pids: Set[int], signum: int) -> bool:
    sent = False
    for pid in pids:
        try:
            os.kill(pid, signum)
            sent = True
        except ProcessLookupError:
            pass
    return sent


def _reap(proc: subprocess.Popen) -> None:
    """Reap the step's leader through its Popen, then whatever else ended that was handed to
    this process as subreaper."""
    proc.poll()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to init, as without this
        pass
