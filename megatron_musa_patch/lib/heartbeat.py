"""A line saying what a process is doing whenever it has said nothing for a while.

:class:`Heartbeat` runs a daemon thread that, once ``quiet_s`` seconds pass without output,
prints what ``describe()`` says and waits for the next quiet spell. Output is noticed through
:class:`NoticingStream`, a proxy for ``sys.stdout``/``sys.stderr`` (writes made below Python,
such as a C++ library's, are not seen: at worst a line comes that was not needed).

:func:`describe_stack` names what a thread is doing from its Python stack: the innermost frame
that a table of function names knows, a module being imported, or ``torch.compile`` at work.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Dict, Iterable, Optional


#: how long without output before a line says what is being done
QUIET_S = 5.0


def say(line: str) -> None:
    """A progress line, out at once."""
    print(line, flush=True)


class NoticingStream:
    """A text stream that calls ``on_write`` before each write; everything else is the
    stream's own."""

    def __init__(self, stream, on_write: Callable[[], None]):
        self._stream = stream
        self._on_write = on_write

    def write(self, text):
        if text:
            self._on_write()
        return self._stream.write(text)

    def writelines(self, lines):
        self._on_write()
        return self._stream.writelines(lines)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class Heartbeat:
    """``say(describe(seconds since start))`` after each ``quiet_s`` seconds without output,
    until :meth:`stop`, ``most_s`` seconds after :meth:`start`, or ``until()`` is true."""

    def __init__(self, say: Callable[[str], None], describe: Callable[[float], str], *,
                 quiet_s: float = QUIET_S, most_s: float = 3600.0, poll_s: float = 0.5,
                 until: Optional[Callable[[], bool]] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.say, self.describe, self.until = say, describe, until
        self.quiet_s, self.most_s, self.poll_s, self.clock = quiet_s, most_s, poll_s, clock
        self.began = self.last = clock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._streams = {}

    def written(self) -> None:
        self.last = self.clock()

    def last_output(self) -> float:
        """When output last came (or the heartbeat started), in ``time.time()`` seconds."""
        return time.time() - (self.clock() - self.last)

    def written_at(self, wall: float) -> None:
        """Output came at ``wall`` (``time.time()``) in another process that said what this one
        now goes on saying: the next line is due ``quiet_s`` after it."""
        self.last = min(self.last, self.clock() - (time.time() - wall))

    def notice(self, holder=sys) -> None:
        """Notice what is written to ``holder.stdout`` and ``holder.stderr`` from now on."""
        for name in ("stdout", "stderr"):
            stream = getattr(holder, name)
            if stream is not None and not isinstance(stream, NoticingStream):
                self._streams[name] = (holder, stream)
                setattr(holder, name, NoticingStream(stream, self.written))

    def start(self) -> "Heartbeat":
        """Start the thread (once: a second call changes nothing)."""
        if self._thread is not None:
            return self
        self.began = self.last = self.clock()
        self._thread = threading.Thread(target=self._run, name="mmp-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for name, (holder, stream) in self._streams.items():
            if isinstance(getattr(holder, name), NoticingStream):
                setattr(holder, name, stream)
        self._streams.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = self.clock()
            if now - self.began >= self.most_s or (self.until is not None and self.until()):
                return
            if now - self.last >= self.quiet_s:
                try:
                    self.say(self.describe(now - self.began))
                except Exception:  # noqa: BLE001 - a progress line must never fail the run
                    return
                self.last = self.clock()


def describe_stack(frame, phases: Dict[str, str], default: str = "starting") -> str:
    """What the thread whose innermost frame is ``frame`` is doing: ``phases`` maps function
    names to words (the innermost known frame wins), an import in progress names its module,
    and frames of ``torch._dynamo``/``torch._inductor`` mean compiling."""
    frames = list(_outward(frame))
    for f in frames:
        if _in_package(f, ("torch", "_dynamo")) or _in_package(f, ("torch", "_inductor")):
            return "compiling with torch.compile"
    # a module being imported: the innermost module body (read off its globals, not the frame's
    # locals, which another thread must not touch) under an import
    importing = any(f.f_code.co_name == "_find_and_load" for f in frames)
    for f in frames:  # innermost first
        name = f.f_code.co_name
        if name in phases:
            return phases[name]
        if importing and name == "<module>":
            module = f.f_globals.get("__name__")
            if isinstance(module, str) and module != "__main__":
                return f"importing {'.'.join(module.split('.')[:3])}"
    return default


def _outward(frame) -> Iterable:
    while frame is not None:
        yield frame
        frame = frame.f_back


def _in_package(frame, parts) -> bool:
    return (os.sep + os.sep.join(parts) + os.sep) in frame.f_code.co_filename


def main_thread_frame():
    """The main thread's innermost frame (from another thread)."""
    return sys._current_frames().get(threading.main_thread().ident)
