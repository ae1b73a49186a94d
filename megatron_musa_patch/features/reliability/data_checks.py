"""Training data checked where megatron-core builds its datasets: the split before any index, then
each prefix where it is opened (``GPTDataset.build_low_level_dataset``).

Upstream opens each ``--data-path`` prefix with ``IndexedDataset`` and trusts it: a missing pair
fails with an AttributeError from ``__del__``, a truncated ``.bin`` with a numpy buffer error,
and token ids the tokenizer does not have reach the embedding, which fails with "index out of
range" (or, on a GPU, a device-side assert) when the id is past the padded vocabulary and trains
silently on garbage rows when it is not. Here every prefix is checked like ``mmp data blend``
checks it (both files present, sizes consistent, not empty), and its token ids are compared with
the training tokenizer's ``vocab_size`` (all of them up to ``SCAN_TOKENS`` per file, evenly spaced
windows beyond that), so data tokenized with another vocabulary stops the job at start-up with
the file, the document and the fix.

Before that, when ``BlendedMegatronDatasetBuilder.build`` starts and before it builds any index,
a ``--split`` that leaves a dataset with no document of a prefix while samples are asked of it
(``data.splits``) is refused: upstream never finishes building that dataset's index. Every rank
finds it; rank 0 says it, and the others wait for the launcher to stop them, so the paragraph is
printed once.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.data import splits
from megatron_musa_patch.data.errors import DataError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--data-path pairs checked at start-up: present, undamaged, token ids within the "
    "tokenizer's vocabulary; a --split that leaves a dataset with no document refused",
    aliases=("data_checks",))


#: tokens per file read for the id check (all of a smaller file): ~128 MiB of uint16 ids
SCAN_TOKENS = 1 << 26
_WINDOWS = 64
#: how long a rank other than 0 that found an empty split waits for the launcher to stop it
#: (rank 0 raises the same error, which ends the job) before it raises the error itself
OTHER_RANKS_WAIT_S = 60.0


@hookimpl
def mmp_register_patches(session, registry):
    # (file, vocabulary size) pairs this run has checked: each file is read once per run
    checked = session.state_for(FEATURE.name, set)
    registry.add(FEATURE.patch(
        "gpt_low_level_dataset",
        "megatron.core.datasets.gpt_dataset:GPTDataset.build_low_level_dataset", "wrap",
        functools.partial(_build_low_level_dataset, checked),
        why="check each --data-path pair and its token ids against the tokenizer"))
    registry.add(FEATURE.patch(
        "empty_split",
        "megatron.core.datasets.blended_megatron_dataset_builder:"
        "BlendedMegatronDatasetBuilder.build", "wrap",
        functools.partial(_build_datasets, session.is_rank_zero, time.sleep),
        why="refuse a --split that gives a dataset no document while samples are asked of it "
            "(upstream loops forever building its index)"))


def _build_datasets(is_rank_zero, sleep, wrapped, instance, args, kwargs):
    found = empty_split_datasets(instance.cls, instance.sizes, instance.config)
    if found:
        error = DataError(splits.message(found, instance.config.split))
        if not is_rank_zero():
            sleep(OTHER_RANKS_WAIT_S)
        raise error
    return wrapped(*args, **kwargs)


def empty_split_datasets(cls, sizes, config):
    """What ``data.splits.empty_datasets`` finds for a GPT dataset class (whose split counts
    sequences); nothing for other classes."""
    from megatron.core.datasets.gpt_dataset import GPTDataset

    if not (isinstance(cls, type) and issubclass(cls, GPTDataset)):
        return []
    return splits.empty_datasets(sizes, config)


def _build_low_level_dataset(checked, wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    path, config = call.get("dataset_path"), call.get("config")
    if not isinstance(path, str) or "://" in path or getattr(config, "mock", False):
        return wrapped(*args, **kwargs)  # object storage or mock data: nothing on disk here
    check_pair(path)
    dataset = wrapped(*args, **kwargs)
    tokenizer = getattr(config, "tokenizer", None)
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab:
        key = (os.path.realpath(path + ".bin"), int(vocab))
        if key not in checked:
            check_token_range(path, dataset, int(vocab), tokenizer_name(tokenizer))
            checked.add(key)
    return dataset


def tokenizer_name(tokenizer) -> str:
    """The class doing the tokenizing: megatron-core's new tokenizer API wraps a library
    tokenizer (``DefaultTokenizerText`` around e.g. ``NullTokenizer``) in ``_tokenizer``."""
    return type(getattr(tokenizer, "_tokenizer", None) or tokenizer).__name__


def check_pair(prefix: str) -> None:
    """Both files present, sizes consistent, not empty: ``mmp data blend``'s checks."""
    from megatron_musa_patch.data.blend import check

    shard = check(prefix)
    if shard.problem is None:
        return
    missing = not os.path.exists(prefix + ".bin") and not os.path.exists(prefix + ".idx")
    what = ("no such .bin/.idx pair (looked for " + prefix + ".bin and " + prefix + ".idx)"
            if missing else shard.problem)
    fix = ("check the prefix: --data-path takes the path without .bin/.idx (as `mmp data "
           "blend DIR` prints it)" if missing else
           "rebuild it (`mmp data prepare` redoes pairs that are not complete), or leave it out "
           "of --data-path (`mmp data blend --skip-bad-shards` lists the usable ones)")
    raise DataError(f"--data-path {prefix}: {what}. Fix: {fix}.")


def check_token_range(prefix: str, dataset, vocab_size: int, tokenizer_name: str) -> None:
    """Raise DataError when a token id of ``prefix`` is not in ``[0, vocab_size)``."""
    index = dataset.index
    dtype = np.dtype(index.dtype)
    total = int(index.sequence_lengths.astype(np.int64).sum())
    found = first_out_of_range(prefix + ".bin", dtype, total, vocab_size)
    if found is None:
        return
    position, token = found
    pointers = index.sequence_pointers // dtype.itemsize
    sequence = int(np.searchsorted(pointers, position, side="right") - 1)
    document = int(np.searchsorted(index.document_indices, sequence, side="right") - 1)
    raise DataError(
        f"--data-path {prefix}: token id {token} (document {document}) is outside the training "
        f"tokenizer's vocabulary ({tokenizer_name}, vocab_size {vocab_size}), so this data was "
        f"tokenized with a different, larger vocabulary. Fix: train with the tokenizer the data "
        f"was prepared with (--tokenizer-type, --tokenizer-model, --vocab-size), or tokenize the "
        f"data again with this one (`mmp data prepare`).")


def first_out_of_range(bin_path: str, dtype, total: int, vocab_size: int):
    """(position, id) of the first id outside ``[0, vocab_size)`` found, or None. Reads every id of a file
    up to SCAN_TOKENS, and evenly spaced windows of that many in all beyond."""
    if total == 0:
        return None
    ids = np.memmap(bin_path, dtype=dtype, mode="r", shape=(total,))
    if total <= SCAN_TOKENS:
        spans = [(0, total)]
    else:
        width = SCAN_TOKENS // _WINDOWS
        starts = np.linspace(0, total - width, _WINDOWS).astype(np.int64)
        spans = [(int(s), int(s) + width) for s in starts]
    step = 1 << 22
    for start, end in spans:
        for lo in range(start, end, step):
            chunk = ids[lo:min(end, lo + step)]
            if int(chunk.max()) >= vocab_size or int(chunk.min()) < 0:
                at = int(np.argmax((chunk >= vocab_size) | (chunk < 0)))
                return lo + at, int(chunk[at])
    return None
