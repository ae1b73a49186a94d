"""The records ``mmp data prepare`` passes between its modules and processes.

A leaf: it imports nothing from the package, so ``encode`` (worker side), ``writer`` (main side)
and ``prepare`` can all use these types without importing each other (imports inside ``data/``
flow one way: see ``tests/data/test_layering.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np


@dataclass(frozen=True)
class Settings:
    """What every worker needs to turn a chunk into token arrays (picklable, compared by value:
    a forked worker that inherited equal settings skips building its own tokenizer)."""
    json_keys: Tuple[str, ...]
    append_eod: bool
    skip_bad_lines: bool
    dtype: str  # numpy dtype name of the .bin file
    eod: Optional[int]
    vocab_size: Optional[int]
    allow_fast: bool = True


@dataclass(frozen=True)
class Task:
    file_index: int
    chunk_index: int
    path: str
    kind: str
    start: int
    end: int


@dataclass
class Packed:
    """One key's documents of a chunk, as the builder stores them."""
    tokens: np.ndarray          # output dtype
    seq_lengths: np.ndarray     # int32, one per sequence (sentence)
    doc_seq_counts: np.ndarray  # int64, sequences per document


@dataclass
class ChunkResult:
    file_index: int
    chunk_index: int
    first_offset: int = 0       # byte offset of the chunk's first line
    unit: str = "line"          # what ``index`` counts in bad/fatal: line | element
    documents: int = 0
    tokens: int = 0
    nbytes: int = 0
    blank: int = 0
    bad_count: int = 0
    bad: List[Tuple[int, str]] = field(default_factory=list)
    fatal: Optional[Tuple[int, str, str]] = None  # (index, what is wrong, fix)
    keys: List[Packed] = field(default_factory=list)
