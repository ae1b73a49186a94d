"""Expand ``--input`` into files and cut each file into chunks the workers read themselves.

``--input`` takes files, globs and directories. Directories and globs pick up ``.jsonl``,
``.json`` and ``.txt`` files (recursively, sorted, hidden files ignored); a file named explicitly
is read whatever its suffix (as JSON lines, like ``tools/preprocess_data.py`` does).

Kinds of input:

* ``jsonl``      one JSON object per line (``.jsonl``, ``.json`` that does not start with ``[``,
                 and any other explicitly named file)
* ``json_array`` a ``.json`` file holding one array of objects (read whole, by one worker)
* ``txt_lines``  ``.txt``, one document per line (the default)
* ``txt_file``   ``.txt``, the whole file is one document (``--txt-whole-file``)

Chunks are byte ranges. A worker owns every line that *starts* inside its range, so the main
process never reads the corpus and the chunks partition the lines exactly.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Iterator, List, Sequence, Tuple

from .errors import DataError

SUFFIXES = (".jsonl", ".json", ".txt")
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute
    kind: str  # jsonl | json_array | txt_lines | txt_file
    size: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def expand(patterns: Sequence[str], txt_whole_file: bool = False) -> List[InputFile]:
    """Resolve ``--input`` values to a de-duplicated list of readable files (empty ones included:
    the caller decides whether they are an error)."""
    seen = set()
    files: List[InputFile] = []
    for pattern in patterns:
        for path in _paths(pattern):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            files.append(_describe(os.path.abspath(path), txt_whole_file))
    if not files:
        raise DataError(
            f"--input {' '.join(patterns)}: no .jsonl, .json or .txt files found. Fix: name the "
            "files, a directory holding them, or a quoted glob such as 'data/*.jsonl'.")
    return files


def _paths(pattern: str) -> Iterator[str]:
    if os.path.isdir(pattern):
        yield from _walk(pattern)
        return
    if os.path.exists(pattern):
        yield pattern
        return
    if glob.has_magic(pattern):
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise DataError(f"--input {pattern}: the glob matches nothing. Fix: check the path "
                            "and quote the glob so the shell does not expand it.")
        for match in matches:
            if os.path.isdir(match):
                yield from _walk(match)
            elif match.endswith(SUFFIXES):
                yield match
        return
    raise DataError(f"--input {pattern}: no such file or directory. Fix: check the path.")


def _walk(directory: str) -> Iterator[str]:
    found = []
    for root, dirs, names in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(root, n) for n in names
                     if n.endswith(SUFFIXES) and not n.startswith("."))
    if not found:
        raise DataError(f"--input {directory}: the directory holds no .jsonl, .json or .txt "
                        "files. Fix: point --input at the files or at the directory holding them.")
    yield from sorted(found)


def _describe(path: str, txt_whole_file: bool) -> InputFile:
    if path.endswith(COMPRESSED):
        raise DataError(f"{path}: compressed input is not supported. Fix: decompress it first "
                        "(e.g. `gunzip -k`); chunked parallel reading needs a seekable file.")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(4096).lstrip()
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror}). Fix: check the path and its "
                        "permissions.") from None
    if path.endswith(".txt"):
        kind = "txt_file" if txt_whole_file else "txt_lines"
    elif path.endswith(".json") and head.startswith(b"["):
        kind = "json_array"
    else:
        kind = "jsonl"
    return InputFile(path, kind, size)


def chunk_size_for(total_bytes: int, workers: int, requested: int = 0) -> int:
    """Bytes per chunk: small enough to keep every worker busy on a small corpus, large enough
    (at most 1 MiB by default) that per-task overhead vanishes and memory stays bounded."""
    if requested > 0:
        return requested
    per_worker = total_bytes // max(1, workers * 4)
    return max(64 << 10, min(1 << 20, per_worker))


#: the first chunk of a run: small, so the first tokens are written (and the progress moves)
#: a moment after the workers start instead of after a whole 1 MiB chunk
FIRST_CHUNK = 64 << 10


def chunks(file: InputFile, chunk_bytes: int, first_bytes: int = 0) -> List[Tuple[int, int]]:
    """Byte ranges ``[start, end)`` covering ``file``; whole-file kinds get one range. With
    ``first_bytes`` smaller than ``chunk_bytes``, the first range is that long."""
    if file.kind in ("json_array", "txt_file") or file.size <= chunk_bytes:
        return [(0, file.size)]
    head = []
    start = 0
    if 0 < first_bytes < chunk_bytes:
        head, start = [(0, first_bytes)], first_bytes
    return head + [(s, min(s + chunk_bytes, file.size))
                   for s in range(start, file.size, chunk_bytes)]


def read_lines(path: str, start: int, end: int) -> Tuple[int, List[bytes]]:
    """The lines that start in ``[start, end)``, without their ``\\n``; and the byte offset of the
    first of them (to turn a line index back into a line number on errors)."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            at_line_start = f.read(1) == b"\n"
        else:
            at_line_start = True
        data = f.read(end - start)
        # the last line that starts here may run past ``end``: read it to its end
        if data and not data.endswith(b"\n"):
            data += f.readline()
    first = start
    if not at_line_start:
        # the line under ``start`` belongs to the previous chunk
        cut = data.find(b"\n")
        if cut < 0:
            return end, []
        first = start + cut + 1
        data = data[cut + 1:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return first, lines
