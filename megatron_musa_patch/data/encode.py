"""Worker side of ``mmp data prepare``: read one chunk, parse it, tokenize it, pack it.

A chunk comes back as a few numpy arrays per JSON key (tokens in the output dtype, sequence
lengths, sequences per document), so the main process only appends bytes to the ``.bin`` file
and numbers to the index: it never touches Python lists of ids the way preprocess_data.py's
main process does, and it never reads the corpus.

Document semantics follow preprocess_data.py's ``Encoder.encode`` exactly: a key's value is a
string or a list of strings (sentences); sentences that tokenize to nothing are dropped; with
``--append-eod`` a non-empty document gets ``eod`` appended to its last sentence; every line
yields one document per key, even an empty one.
"""

from __future__ import annotations

import json
import os
import signal
from typing import List

import numpy as np

from .bytelevel import FastPathMismatch
from .inputs import read_lines
from .types import ChunkResult, Packed, Settings, Task

__all__ = ["BadLine", "ChunkResult", "Packed", "Settings", "Task", "init_worker", "pack", "prime",
           "process_chunk"]

MAX_BAD_EXAMPLES = 20


class BadLine(Exception):
    def __init__(self, reason: str, fix: str = ""):
        super().__init__(reason)
        self.reason, self.fix = reason, fix


# ---------------------------------------------------------------- worker state
_STATE: dict = {}


def prime(settings: Settings, encoder) -> None:
    """Set the worker state in this process; forked workers inherit it (no second load).
    ``encoder``: a ``tokenizer.TextEncoder`` or a ``light.LightEncoder`` (``.encode(texts)``)."""
    _STATE["settings"] = settings
    _STATE["encoder"] = encoder


def init_worker(settings: Settings, source, niceness: int = 0) -> None:
    """Pool initializer: Ctrl-C is the main process's to handle; one tokenizer thread per worker
    (the worker processes are the parallelism, as in preprocess_data.py). ``source`` is what a
    spawned worker builds its encoder from: a ``light.LightSpec`` (tokenizer.json alone), or the
    tokenizer flags for megatron-core's builder. ``niceness`` > 0 lowers the worker's priority
    (for good: an unprivileged process cannot raise it again)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if niceness > 0:
        os.nice(niceness)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    if _STATE.get("settings") != settings:  # spawned, not forked: build it here, once
        from . import light

        if isinstance(source, light.LightSpec):
            prime(settings, light.LightEncoder(source))
        else:
            from .tokenizer import TextEncoder, build

            prime(settings, TextEncoder(build(source), allow_fast=settings.allow_fast))


def encoder_path() -> str:
    return _STATE["encoder"].path


# ---------------------------------------------------------------- one chunk
def process_chunk(task: Task) -> ChunkResult:
    settings: Settings = _STATE["settings"]
    result = ChunkResult(task.file_index, task.chunk_index, nbytes=task.end - task.start)
    keys = settings.json_keys
    values: List[list] = [[] for _ in keys]  # per key: one str or list of str per document
    doc_index: List[int] = []                # line/element index of each document
    nested = False

    def bad(index: int, exc: BadLine) -> bool:
        """Record a bad line; True when the chunk must stop (not skipping)."""
        if not settings.skip_bad_lines:
            result.fatal = (index, exc.reason, exc.fix)
            return True
        result.bad_count += 1
        if len(result.bad) < MAX_BAD_EXAMPLES:
            result.bad.append((index, exc.reason))
        return False

    for index, record in _records(task, result):
        try:
            if isinstance(record, BadLine):
                raise record
            if record is None:
                result.blank += 1
                continue
            row = []
            for key in keys:
                value = record.get(key, _MISSING) if isinstance(record, dict) else _MISSING
                row.append(_check_value(record, key, value))
                nested = nested or isinstance(value, list)
        except BadLine as exc:
            if bad(index, exc):
                return result
            continue
        for column, value in zip(values, row):
            column.append(value)
        doc_index.append(index)

    encoder = _STATE["encoder"]
    dtype = np.dtype(settings.dtype)
    while True:  # restarted when a document the tokenizer rejects is skipped
        result.keys, result.tokens = [], 0
        failed = None
        for column in values:
            counts, texts = _sentences(column, nested)
            try:
                flat, lens = encoder.encode(texts)
            except Exception as exc:  # noqa: BLE001 - the tokenizer's failure, located below
                failed = _locate_failure(encoder, column, exc)
                break
            packed, problem = pack(flat, lens, counts, settings, dtype)
            if problem is not None:
                doc, reason, fix = problem
                result.fatal = (doc_index[doc], reason, fix)
                return result
            result.tokens += int(packed.tokens.size)
            result.keys.append(packed)
        if failed is None:
            break
        doc, exc = failed
        if bad(doc_index[doc], exc):
            return result
        for column in values:
            del column[doc]
        del doc_index[doc]
    result.documents = len(doc_index)
    return result


def _sentences(column: list, nested: bool):
    """(sentences per document, flat list of sentences) for one key's column."""
    if not nested:
        return np.ones(len(column), dtype=np.int64), column
    counts = np.fromiter((len(v) if isinstance(v, list) else 1 for v in column),
                         dtype=np.int64, count=len(column))
    return counts, [s for v in column for s in (v if isinstance(v, list) else (v,))]


def _locate_failure(encoder, column: list, exc: Exception):
    """The first document whose text the tokenizer rejects, and why."""
    if isinstance(exc, FastPathMismatch):
        raise exc  # our bug, not the document's: never skipped
    for doc, value in enumerate(column):
        try:
            encoder.encode(value if isinstance(value, list) else [value])
        except FastPathMismatch:
            raise
        except Exception as inner:  # noqa: BLE001
            exc = inner
            break
    else:
        raise exc
    detail = " ".join(str(exc).split())[:300]
    return doc, BadLine(f"the tokenizer failed on this document ({type(exc).__name__}: "
                        f"{detail})", "fix the text, or pass --skip-bad-lines to skip it")


_MISSING = object()


def _check_value(record, key, value):
    if not isinstance(record, dict):
        raise BadLine(f"expected a JSON object, found {type(record).__name__}",
                      "write one JSON object per line, e.g. {\"text\": \"...\"}")
    if value is _MISSING:
        have = ", ".join(repr(k) for k in list(record)[:8]) or "none"
        raise BadLine(f"the key {key!r} is missing (keys here: {have})",
                      "name the key that holds the text with --json-keys, fix the line, or pass "
                      "--skip-bad-lines to skip such lines")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise BadLine(f"the value of {key!r} is {type(value).__name__}, not a string or a list of "
                  "strings", "store the text as a JSON string, or pass --skip-bad-lines")


def _records(task: Task, result: ChunkResult):
    """(index, dict | None for a blank line | BadLine) for every line or element of the chunk."""
    if task.kind in ("jsonl", "txt_lines"):
        result.first_offset, lines = read_lines(task.path, task.start, task.end)
        key = _STATE["settings"].json_keys[0]  # the one key a .txt document is stored under
        for i, raw in enumerate(lines):
            if task.kind == "txt_lines":
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
                if not raw.strip():
                    yield i, None
                    continue
                try:
                    yield i, {key: raw.decode("utf-8")}
                except UnicodeDecodeError as exc:
                    yield i, _not_utf8(exc)
                continue
            if not raw.strip():
                yield i, None
                continue
            try:
                yield i, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                yield i, _not_utf8(exc)
            except json.JSONDecodeError as exc:
                yield i, BadLine(f"malformed JSON ({exc.msg}, column {exc.colno})",
                                 "fix the line, or pass --skip-bad-lines to skip malformed lines")
        return
    with open(task.path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        result.first_offset = 0
        yield data.count(b"\n", 0, exc.start), _not_utf8(exc)
        return
    if task.kind == "txt_file":
        yield 0, ({_STATE["settings"].json_keys[0]: text} if text.strip() else None)
        return
    result.unit = "element"
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        result.unit = "line"
        yield exc.lineno - 1, BadLine(f"malformed JSON ({exc.msg}, column {exc.colno})",
                                      "fix the file (a .json input is one array of objects, or "
                                      "one object per line)")
        return
    if not isinstance(items, list):
        yield 0, BadLine("a .json input starting with '[' must be one array of objects")
        return
    yield from enumerate(items)


def _not_utf8(exc: UnicodeDecodeError) -> BadLine:
    return BadLine(f"not valid UTF-8 (byte {exc.start} of the line)",
                   "re-encode the file as UTF-8, or pass --skip-bad-lines")


def pack(flat: np.ndarray, lens: np.ndarray, counts: np.ndarray, settings: Settings,
         dtype: np.dtype):
    """Documents -> (Packed, None), or (None, (document, reason, fix)) when an id does not fit.

    ``flat``: ids of every sentence, concatenated; ``lens``: ids per sentence; ``counts``:
    sentences per document (documents are contiguous runs of sentences)."""
    info = np.iinfo(dtype)
    if flat.size and (flat.min() < info.min or flat.max() > info.max):
        pos = int(np.argmax((flat < info.min) | (flat > info.max)))
        sent_ends = np.cumsum(lens)
        sentence = int(np.searchsorted(sent_ends, pos, side="right"))
        doc = int(np.searchsorted(np.cumsum(counts), sentence, side="right"))
        return None, (doc, _too_large(int(flat[pos]), dtype, settings), _too_large_fix(settings))
    csum = np.concatenate(([0], np.cumsum(lens)))
    doc_end_sent = np.cumsum(counts)
    doc_tokens = csum[doc_end_sent] - csum[doc_end_sent - counts]
    nonzero = lens > 0
    seq_lengths = lens[nonzero]
    doc_of_sentence = np.repeat(np.arange(counts.size), counts)
    doc_seq_counts = np.bincount(doc_of_sentence[nonzero], minlength=counts.size)
    tokens = flat
    if settings.append_eod:
        nonempty = doc_tokens > 0
        last_seq = np.cumsum(doc_seq_counts) - 1
        seq_lengths[last_seq[nonempty]] += 1
        tokens = np.insert(flat, np.cumsum(doc_tokens)[nonempty], settings.eod)
    return Packed(tokens.astype(dtype, copy=False), seq_lengths.astype(np.int32),
                  doc_seq_counts.astype(np.int64)), None


def _too_large(token: int, dtype: np.dtype, settings: Settings) -> str:
    return (f"the tokenizer produced id {token}, which does not fit the {dtype.name} index that "
            f"Megatron's format picks for a vocabulary of {settings.vocab_size} tokens (uint16 "
            "below 65500, else int32): the tokenizer's vocab_size is smaller than its ids")


def _too_large_fix(settings: Settings) -> str:
    return ("use a tokenizer whose vocab_size covers every id it produces (e.g. include added "
            "tokens); for NullTokenizer raise --vocab-size above the largest id in the text")
