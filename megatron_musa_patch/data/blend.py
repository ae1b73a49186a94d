"""``mmp data blend``: check ``.bin/.idx`` pairs and print the weighted ``DATA_PATH``.

Every pair's index is read with the checks megatron-core's ``IndexedDataset`` makes when training
opens it (magic, version, dtype code, arrays as long as the counts; ``indexfile``, without
importing megatron-core, which costs seconds), and checked beyond them: the ``.idx`` has exactly
the size its counts imply, sequence pointers follow the lengths, and the ``.bin`` holds exactly
the bytes the index points at (``tests/data/test_blend.py`` opens the same pairs with
``IndexedDataset``). The result is printed as
``W1 PREFIX1 W2 PREFIX2 ...`` for ``--data-path``, or written one pair per line to a file for
``--data-args-path``. Weights are the shard's tokens (default), documents, or 1 each; Megatron
normalizes them. A damaged or empty shard stops the command unless ``--skip-bad-shards``.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from . import indexfile
from .errors import DataError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="prefixes, .bin/.idx files, directories or quoted globs")
    parser.add_argument("--weight-by", choices=["tokens", "documents", "uniform"],
                        default="tokens", help="weight of each shard (default: tokens)")
    parser.add_argument("--output", metavar="FILE", default=None,
                        help="write the list to FILE (for --data-args-path) instead of stdout")
    parser.add_argument("--skip-bad-shards", action="store_true",
                        help="leave out empty or damaged shards (reported) instead of failing")


@dataclass
class Shard:
    prefix: str
    documents: int = 0
    tokens: int = 0
    problem: Optional[str] = None


def collect(paths: List[str]) -> List[str]:
    """Prefixes named by the arguments, in order, without duplicates."""
    prefixes: List[str] = []

    def add(prefix: str) -> None:
        prefix = os.path.abspath(prefix)
        if prefix not in prefixes:
            prefixes.append(prefix)

    for path in paths:
        if os.path.isdir(path):
            found = sorted({os.path.splitext(p)[0] for ext in ("bin", "idx")
                            for p in glob.glob(os.path.join(glob.escape(path), f"*.{ext}"))})
            if not found:
                raise DataError(f"{path}: the directory holds no .bin/.idx pairs. Fix: point at "
                                "the --output-dir of `mmp data prepare`.")
            for p in found:
                add(p)
        elif not os.path.exists(path) and glob.has_magic(path):
            names = glob.glob(path) + glob.glob(path + ".bin") + glob.glob(path + ".idx")
            matches = sorted({m[:-4] for m in names if m.endswith((".bin", ".idx"))})
            if not matches:
                raise DataError(f"{path}: the glob matches no .bin/.idx files.")
            for m in matches:
                add(m)
        elif path.endswith((".bin", ".idx")):
            add(path[:-4])
        elif os.path.exists(path + ".bin") or os.path.exists(path + ".idx"):
            add(path)
        else:
            raise DataError(f"{path}: no such prefix, pair or directory (looked for {path}.bin "
                            f"and {path}.idx). Fix: check the path.")
    return prefixes


def check(prefix: str) -> Shard:
    """Read the index with the checks training makes, then check that its sizes add up."""
    shard = Shard(prefix)
    for ext in (".bin", ".idx"):
        if not os.path.exists(prefix + ext):
            shard.problem = f"{ext} file missing (an interrupted run?)"
            return shard
    if os.path.getsize(prefix + ".bin") == 0 and os.path.getsize(prefix + ".idx") > 0:
        shard.problem = "empty (.bin has no tokens)"
        return shard
    try:
        index = indexfile.read_index(prefix + ".idx")
    except Exception as exc:  # noqa: BLE001 - any failure to open is damage
        shard.problem = f"damaged ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        return shard
    lengths = index.sequence_lengths.astype(np.int64)
    pointers = index.sequence_pointers
    docs = index.document_indices
    itemsize = index.dtype.itemsize
    shard.documents = int(docs.size - 1)
    shard.tokens = int(lengths.sum())
    expected_idx = indexfile.HEADER_BYTES + lengths.size * (4 + 8) + docs.size * 8
    problems = []
    if os.path.getsize(prefix + ".idx") != expected_idx:
        problems.append(f".idx is {os.path.getsize(prefix + '.idx')} bytes, its counts imply "
                        f"{expected_idx}")
    if docs.size == 0 or docs[0] != 0 or np.any(np.diff(docs) < 0):
        problems.append("document indices are not increasing from 0")
    if lengths.size:
        want = np.concatenate(([0], np.cumsum(lengths[:-1] * itemsize)))
        if not np.array_equal(pointers, want):
            problems.append("sequence pointers do not follow the sequence lengths")
    bin_bytes = os.path.getsize(prefix + ".bin")
    if bin_bytes != shard.tokens * itemsize:
        problems.append(f".bin is {bin_bytes} bytes, the index points at "
                        f"{shard.tokens * itemsize}")
    if problems:
        shard.problem = "damaged (" + "; ".join(problems) + ")"
    elif shard.documents == 0 or shard.tokens == 0:
        shard.problem = f"empty ({shard.documents} documents, {shard.tokens} tokens)"
    return shard


def weight(shard: Shard, by: str) -> int:
    return {"tokens": shard.tokens, "documents": shard.documents, "uniform": 1}[by]


def main(args: argparse.Namespace, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    shards = [check(p) for p in collect(args.paths)]
    bad = [s for s in shards if s.problem]
    good = [s for s in shards if not s.problem]
    for s in bad:
        print(f"blend: {s.prefix}: {s.problem}", file=err)
    if bad and not args.skip_bad_shards:
        raise DataError(f"{len(bad)} of {len(shards)} shard(s) are empty or damaged (listed "
                        f"above), first {bad[0].prefix}: {bad[0].problem}. Fix: rebuild them "
                        "(`mmp data prepare` redoes what is not complete), or pass "
                        "--skip-bad-shards to leave them out.")
    if not good:
        raise DataError("no usable shard left to blend.")
    for s in good:
        if any(c.isspace() for c in s.prefix):
            raise DataError(f"{s.prefix}: Megatron splits --data-path and --data-args-path on "
                            "whitespace, so a prefix cannot contain spaces. Fix: move or rename "
                            "the files.")
    total = sum(weight(s, args.weight_by) for s in good)
    for s in good:
        w = weight(s, args.weight_by)
        print(f"blend: {s.prefix}: {s.documents} documents, {s.tokens} tokens, weight {w} "
              f"({100 * w / total:.2f}%)", file=err)
    if bad:
        print(f"blend: left out {len(bad)} shard(s) (--skip-bad-shards)", file=err)
    pairs = [(weight(s, args.weight_by), s.prefix) for s in good]
    if args.output:
        tmp = args.output + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(f"{w} {p}\n" for w, p in pairs)
        os.replace(tmp, args.output)
        print(f"blend: wrote {len(pairs)} shard(s) to {args.output} (--data-args-path "
              f"{args.output})", file=err)
    else:
        print(" ".join(f"{w} {p}" for w, p in pairs), file=out)
    return 0
