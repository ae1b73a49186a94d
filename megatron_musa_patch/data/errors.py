"""Errors of the data commands: one paragraph naming the file (and line) and the fix."""

from __future__ import annotations

from typing import Optional

from megatron_musa_patch.base.errors import MegatronMusaPatchError


class DataError(MegatronMusaPatchError):
    """A corpus, tokenizer or output problem the user can fix (printed without a traceback)."""


def where(path: str, line: Optional[int] = None, element: Optional[int] = None) -> str:
    """``path:line`` (or ``path: element N`` for JSON arrays) for messages."""
    if line is not None:
        return f"{path}:{line}"
    if element is not None:
        return f"{path}: element {element}"
    return path


def line_number(path: str, offset: int) -> int:
    """1-based number of the line starting at byte ``offset``.

    Only computed on the error path: workers report byte offsets so reading stays chunk-parallel.
    """
    count = 0
    remaining = offset
    with open(path, "rb") as f:
        while remaining > 0:
            block = f.read(min(remaining, 1 << 22))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1
