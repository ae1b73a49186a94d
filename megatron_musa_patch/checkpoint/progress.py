"""Progress of a conversion over its tensors: a tqdm bar on a terminal, otherwise a line at every
tenth of the way (logs, CI)."""

from __future__ import annotations

import contextlib
import sys
import time


class _Lines:
    def __init__(self, total: int, desc: str, unit: str, stream):
        self.total, self.desc, self.unit, self.stream = max(1, total), desc, unit, stream
        self.done, self.start, self._next = 0, time.monotonic(), 0.1

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done / self.total >= self._next or self.done == self.total:
            while self._next <= self.done / self.total:
                self._next += 0.1
            print(f"{self.desc}: {self.done}/{self.total} {self.unit}s "
                  f"({time.monotonic() - self.start:.1f} s)", file=self.stream, flush=True)


@contextlib.contextmanager
def bar(total: int, desc: str, unit: str, stream=None):
    stream = stream or sys.stderr
    if stream.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            with tqdm(total=total, desc=desc, unit=unit, file=stream) as progress:
                yield progress
            return
    yield _Lines(total, desc, unit, stream)
