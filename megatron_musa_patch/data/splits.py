"""The datasets megatron-core's ``BlendedMegatronDatasetBuilder`` would build over no document
while asking samples of them, found from its config before it builds anything.

megatron-core turns ``--split`` into a matrix of shares (``convert_split_vector_to_split_matrix``;
the config holds it as ``split_matrix``) and gives split *i* of a prefix with *n* documents the
documents ``round(begin * n)`` to ``round(end * n)``: a small share of a small corpus rounds to
none. A ``GPTDataset`` over no document that is asked for samples -- any number, 0 too, as it
wants ``samples * seq_length`` tokens plus the extra one -- counts epochs of zero tokens until
it has enough (``GPTDataset._get_num_epochs``): the job spins at 100% CPU with no message.

Megatron's split counts sequences, not documents (``numel_low_level_dataset``); ``mmp data
prepare`` writes one sequence per document, and the messages call them documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from megatron_musa_patch.data import indexfile

#: megatron-core's ``Split`` order, as the messages name the splits
SPLIT_NAMES = ("training", "validation", "test")


@dataclass(frozen=True)
class EmptyDataset:
    split: int                   # 0 training, 1 validation, 2 test
    prefix: str
    documents: int               # of the whole prefix
    share: Tuple[float, float]   # the split's row of split_matrix
    first: int                   # the documents it gets: first .. end (end excluded)
    end: int
    samples: int                 # what the builder asks of the dataset


def document_range(share: Tuple[float, float], documents: int) -> Tuple[int, int]:
    """The documents ``[first, end)`` megatron-core's ``_build_megatron_dataset_splits`` gives a
    split's share of a prefix (inline there, so restated here; the same in 0.16 to 0.19, and
    tests/features/reliability/test_data_checks.py compares it with that method on the installed release)."""
    begin, end = share
    return int(round(begin * float(documents))), int(round(end * float(documents)))


def planned(sizes: Sequence[Optional[int]], config) -> List[Tuple[int, str, tuple, Optional[int]]]:
    """``(split, prefix, share, samples)`` for each dataset the builder makes from a share of a
    ``--data-path`` prefix, as ``_build_blended_dataset_splits`` plans them; a weighted blend's
    samples per prefix are megatron-core's own ``_get_size_per_split_per_dataset`` (the same in
    0.16 to 0.19). Mock data and per-split blends (``--train-data-path`` ...: each takes its
    prefixes whole) plan none."""
    if getattr(config, "mock", False) or not getattr(config, "blend", None):
        return []
    prefixes, weights = config.blend
    matrix = config.split_matrix
    if weights is None:
        # one prefix: the split's size; several: one epoch each (no sample count is asked)
        per_prefix = [list(sizes) if len(prefixes) == 1 else [None] * len(sizes)
                      for _ in prefixes]
    elif any(size is None for size in sizes):
        return []  # weights without sizes: megatron-core refuses it itself
    else:
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            _get_size_per_split_per_dataset)
        from megatron.core.datasets.utils import normalize

        per_prefix = _get_size_per_split_per_dataset(
            normalize(list(weights)), list(sizes), surplus=config.mid_level_dataset_surplus)
    return [(split, prefix, matrix[split], per_prefix[p][split])
            for p, prefix in enumerate(prefixes)
            for split in range(len(matrix)) if matrix[split] is not None]


def sequences_in(prefix: str) -> Optional[int]:
    """The sequence count of a local prefix's ``.idx``; None where there is no readable one (an
    object-storage path, a missing or damaged pair: data_checks' pair check names those)."""
    if "://" in prefix:
        return None
    try:
        return int(indexfile.read_index(prefix + ".idx").sequence_lengths.size)
    except (OSError, ValueError):
        return None


def empty_datasets(sizes: Sequence[Optional[int]], config,
                   documents_of: Callable[[str], Optional[int]] = sequences_in
                   ) -> List[EmptyDataset]:
    """The datasets the builder would make over no document while asking samples of them."""
    extra = int(bool(getattr(config, "add_extra_token_to_sequence", True)))
    found = []
    for split, prefix, share, samples in planned(sizes, config):
        if samples is None or samples * config.sequence_length + extra <= 0:
            continue  # one epoch of what there is, or no token wanted: the build ends
        documents = documents_of(prefix)
        if not documents:
            continue  # unreadable or empty: the pair check says so when Megatron opens it
        first, end = document_range(share, documents)
        if end <= first:
            found.append(EmptyDataset(split, prefix, documents, tuple(share), first, end,
                                      int(samples)))
    return found


def message(found: Sequence[EmptyDataset], split_text: str) -> str:
    """One paragraph for the first split in ``found``: the split, the prefix, its documents, the
    samples asked, and the fix."""
    split = found[0].split
    same = [f for f in found if f.split == split]
    first = same[0]
    name = SPLIT_NAMES[split]
    begin, end = first.share
    text = (f"--split {split_text} gives the {name} split the share {begin:.4g} to {end:.4g} of "
            f"--data-path {first.prefix}, which has {first.documents} documents: that share "
            f"rounds to none of them (documents {first.first} to {first.end})")
    if len(same) > 1:
        others = ", ".join(f"{f.prefix} ({f.documents} documents)" for f in same[1:])
        text += f", nor to any of {others}"
    text += (f". megatron-core still builds that {name} dataset (asked for {first.samples} "
             f"samples) and, with no document to draw tokens from, never finishes building its "
             f"index (it counts empty epochs at 100% CPU, with no message). Fix: ")
    if split == 0:
        text += "a larger training share in --split, or more documents."
    elif _evaluates_nothing(found):
        text += ("--split 100,0,0 (no validation or test share: with --eval-iters 0 nothing "
                 "is evaluated), or more documents.")
    else:
        text += (f"a {name} share that reaches at least one of the {first.documents} documents, "
                 f"more documents, or no evaluation: --eval-iters 0 with --split 100,0,0.")
    return text


def _evaluates_nothing(found: Sequence[EmptyDataset]) -> bool:
    """The validation and test datasets found are asked for no sample (--eval-iters 0)."""
    return all(f.samples == 0 for f in found if f.split > 0)
