"""Progress of ``mmp data prepare``: a tqdm bar on a terminal, plain lines otherwise.

The bar counts input bytes (so its ETA is right even when documents vary in size) and shows
documents/s and tokens/s. Without a terminal (CI, ``| tee``, nohup) one line is printed each
time ``--log-interval`` more documents are done, at most one line every ``min_seconds``.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def _human(n: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}P"


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    def __init__(self, total_bytes: int, log_interval: int = 1000, stream: TextIO = None,
                 tty: Optional[bool] = None, min_seconds: float = 1.0, disable: bool = False):
        self.stream = stream or sys.stderr
        self.total = max(1, total_bytes)
        self.log_interval = max(1, log_interval)
        self.min_seconds = min_seconds
        self.disable = disable
        self.start = time.monotonic()
        self.bytes = self.docs = self.tokens = 0
        self._last_line_docs = 0
        self._last_line_time = 0.0
        self.bar = None
        isatty = getattr(self.stream, "isatty", lambda: False)()
        if not disable and (isatty if tty is None else tty):
            import shutil

            from tqdm import tqdm

            # the size from shutil (ioctl, then $COLUMNS/$LINES, then 80x24): some ptys report
            # 0 x 0 to tqdm's own probe, which then draws a broken bar or none
            size = shutil.get_terminal_size()
            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024,
                            file=self.stream, desc="prepare", smoothing=0.1,
                            ncols=max(size.columns, 40), nrows=max(size.lines, 2))

    def update(self, nbytes: int, docs: int, tokens: int) -> None:
        self.bytes += nbytes
        self.docs += docs
        self.tokens += tokens
        if self.disable:
            return
        elapsed = max(1e-9, time.monotonic() - self.start)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{_human(self.docs / elapsed)} docs/s, "
                                     f"{_human(self.tokens / elapsed)} tokens/s", refresh=False)
            self.bar.update(nbytes)
            return
        now = time.monotonic()
        if (self.docs - self._last_line_docs >= self.log_interval
                and now - self._last_line_time >= self.min_seconds):
            self._last_line_docs, self._last_line_time = self.docs, now
            self.line(self.status(elapsed))

    def status(self, elapsed: float) -> str:
        frac = min(1.0, self.bytes / self.total)
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0
        return (f"prepare: {self.docs} documents ({_human(self.docs / elapsed)} docs/s), "
                f"{self.tokens} tokens ({_human(self.tokens / elapsed)} tokens/s), "
                f"{self.bytes / 2**20:.1f}/{self.total / 2**20:.1f} MiB ({100 * frac:.1f}%), "
                f"elapsed {_duration(elapsed)}, ETA {_duration(eta)}")

    def line(self, text: str) -> None:
        """A message that does not break the bar."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
