"""reliability.data_checks' split check, without ranks: which datasets megatron-core's builder would make over
no document while asking samples of them (``data.splits``), computed from Megatron's own config
and compared with its own split arithmetic; and the wrapper around
``BlendedMegatronDatasetBuilder.build`` (rank 0 refuses at once, the others after waiting for
the launcher). The run through the stock pretrain_gpt.py is
tests/training/test_bad_data.py::test_split_that_leaves_the_validation_set_no_document."""

import types

import numpy as np
import pytest

from megatron_musa_patch.data import indexfile, splits
from megatron_musa_patch.data.errors import DataError


def corpus(tmp_path, documents, name="docs_document"):
    """A .idx of ``documents`` one-sequence documents (the split reads only the index)."""
    prefix = tmp_path / name
    indexfile.write_index(f"{prefix}.idx", np.uint16, np.full(documents, 40),
                          np.arange(documents + 1))
    return str(prefix)


#: what GPTDataset reads of a tokenizer (its identity for the cache key, the eod and pad ids)
TOKENIZER = types.SimpleNamespace(vocab_size=1000, eod=0, pad=1,
                                  unique_identifiers={"class": "stand-in"})


def config(split, prefixes, weights=None, **extra):
    """megatron-core's own GPTDatasetConfig: its __post_init__ makes split_matrix from --split."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    blend = (list(prefixes), weights) if prefixes else None
    return GPTDatasetConfig(random_seed=1, sequence_length=64, blend=blend, split=split,
                            reset_position_ids=False, reset_attention_mask=False,
                            eod_mask_loss=False,
                            tokenizer=TOKENIZER, **extra)


SPLITS = ["99,1,0", "98,2,0", "90,5,5", "1,99,0", "100,0,0", "949,50,1", "33,33,34", "0,1,0"]


@pytest.mark.parametrize("split", SPLITS)
def test_document_ranges_are_megatrons(split):
    """``document_range`` gives each split the documents megatron-core's own
    ``_build_megatron_dataset_splits`` hands the dataset class, for 1 to 120 documents."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)

    class Recorded:  # stands in for GPTDataset: the "low-level dataset" is its document count
        def __init__(self, documents, path, indices, samples, index_split, cfg):
            self.indices = indices

        @staticmethod
        def build_low_level_dataset(path, cfg):
            return int(path)

        @staticmethod
        def numel_low_level_dataset(documents):
            return documents

    cfg = config(split, ["unused"])
    builder = BlendedMegatronDatasetBuilder(Recorded, [1, 1, 1], lambda: True, cfg)
    for documents in range(1, 121):
        built = builder._build_megatron_dataset_splits(str(documents), cfg.split_matrix,
                                                       [1, 1, 1])
        for share, dataset in zip(cfg.split_matrix, built):
            assert (share is None) == (dataset is None)
            if share is not None:
                first, end = splits.document_range(share, documents)
                assert np.array_equal(dataset.indices, np.arange(first, end)), \
                    (split, documents, share)


def test_a_validation_share_of_no_document_is_found_whatever_it_is_asked(tmp_path):
    """50 documents, --split 99,1,0: the validation share rounds to documents 50 to 50. Asked
    for 0 samples (--eval-iters 0) the dataset still wants one token, so it is refused too."""
    prefix = corpus(tmp_path, 50)
    weighted = config("99,1,0", [prefix], [54520.0])  # as `mmp data blend` writes DATA_PATH
    found = splits.empty_datasets((24, 0, 0), weighted)
    assert found == [splits.EmptyDataset(1, prefix, 50, (0.99, 1.0), 50, 50, 0)]
    text = splits.message(found, "99,1,0")
    assert text.startswith(f"--split 99,1,0 gives the validation split the share 0.99 to 1 of "
                           f"--data-path {prefix}, which has 50 documents: that share rounds to "
                           f"none of them (documents 50 to 50).")
    assert "(asked for 0 samples)" in text and "never finishes building its index" in text
    assert text.endswith("Fix: --split 100,0,0 (no validation or test share: with --eval-iters 0 "
                         "nothing is evaluated), or more documents.")
    # with evaluation: a weighted blend asks the mid-level dataset its share plus the surplus
    found = splits.empty_datasets((24, 16, 16), weighted)
    assert [(f.split, f.samples) for f in found] == [(1, 17)]
    assert splits.message(found, "99,1,0").endswith(
        "Fix: a validation share that reaches at least one of the 50 documents, more documents, "
        "or no evaluation: --eval-iters 0 with --split 100,0,0.")
    # one prefix without a weight: the split's own target
    found = splits.empty_datasets((24, 16, 16), config("99,1,0", [prefix]))
    assert [(f.split, f.samples) for f in found] == [(1, 16)]


def test_a_training_share_of_no_document_is_found(tmp_path):
    prefix = corpus(tmp_path, 50)
    found = splits.empty_datasets((24, 16, 16), config("1,99,0", [prefix]))
    assert [(f.split, f.first, f.end, f.samples) for f in found] == [(0, 0, 0, 24)]
    assert splits.message(found, "1,99,0").endswith(
        "Fix: a larger training share in --split, or more documents.")


def test_each_empty_prefix_of_a_blend_is_named(tmp_path):
    small, other, large = corpus(tmp_path, 50, "a"), corpus(tmp_path, 40, "b"), \
        corpus(tmp_path, 200, "c")
    found = splits.empty_datasets((24, 16, 16),
                                  config("99,1,0", [small, other, large], [1.0, 1.0, 2.0]))
    assert [(f.prefix, f.documents) for f in found] == [(small, 50), (other, 40)]
    assert f"none of them (documents 50 to 50), nor to any of {other} (40 documents)." \
        in splits.message(found, "99,1,0")


@pytest.mark.parametrize("documents, split, sizes", [
    (51, "99,1,0", (24, 0, 0)),     # round(50.49) = 50: the validation split has document 50
    (86, "99,1,0", (24, 16, 16)),
    (50, "100,0,0", (24, 16, 16)),  # no validation or test split is built
    (50, "98,2,0", (24, 16, 16)),
])
def test_splits_that_reach_a_document_pass(tmp_path, documents, split, sizes):
    assert splits.empty_datasets(sizes, config(split, [corpus(tmp_path, documents)])) == []


def test_what_asks_no_sample_or_has_no_readable_index_passes(tmp_path):
    prefix = corpus(tmp_path, 50)
    # several prefixes without weights: one epoch of each (Megatron asks no count of them)
    assert splits.empty_datasets((24, 16, 16), config("99,1,0", [prefix, prefix])) == []
    # no extra token and 0 samples: no token is wanted, so the index is built (empty)
    assert splits.empty_datasets((24, 0, 0), config("99,1,0", [prefix],
                                                    add_extra_token_to_sequence=False)) == []
    # mock data, object storage, a missing pair (the pair check names it): nothing read here
    assert splits.empty_datasets((24, 16, 16), config(None, None)) == []
    for missing in ("s3://bucket/docs_document", str(tmp_path / "nothing_here")):
        assert splits.empty_datasets((24, 16, 16), config("99,1,0", [missing])) == []


# ----------------------------------------------------------------------------- the wrapper

def builder_of(cfg, sizes, cls=None):
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder)
    from megatron.core.datasets.gpt_dataset import GPTDataset

    return BlendedMegatronDatasetBuilder(cls or GPTDataset, sizes, lambda: True, cfg)


def test_rank_zero_refuses_at_once_and_the_others_after_waiting(tmp_path):
    from megatron_musa_patch.features.reliability import data_checks

    builder = builder_of(config("99,1,0", [corpus(tmp_path, 50)]), [24, 16, 16])
    built, waited = [], []

    def build():  # upstream's build would never return here
        built.append(True)

    with pytest.raises(DataError, match=r"^--split 99,1,0 gives the validation split"):
        data_checks._build_datasets(lambda: True, waited.append, build, builder, (), {})
    assert waited == [] and built == []
    with pytest.raises(DataError, match=r"^--split 99,1,0 gives the validation split"):
        data_checks._build_datasets(lambda: False, waited.append, build, builder, (), {})
    assert waited == [data_checks.OTHER_RANKS_WAIT_S] and built == []


def test_a_split_that_reaches_documents_is_built_by_upstream(tmp_path):
    """--split 100,0,0 on the same 50 documents: upstream's own build runs and makes the
    training dataset (the .bin is needed now)."""
    from megatron_musa_patch.features.reliability import data_checks
    from tests.harness.stock import write_bin_idx

    prefix = str(write_bin_idx(tmp_path / "docs_document", documents=50))
    builder = builder_of(config("100,0,0", [prefix]), [24, 16, 16])
    train, valid, test = data_checks._build_datasets(lambda: True, None, builder.build, builder,
                                                     (), {})
    assert len(train) >= 24 and valid is None and test is None


def test_other_dataset_classes_pass_through(tmp_path):
    from megatron_musa_patch.features.reliability import data_checks

    class NotGPT:
        pass

    cfg = config("99,1,0", [corpus(tmp_path, 50)])
    assert data_checks.empty_split_datasets(NotGPT, [24, 16, 16], cfg) == []
    assert len(data_checks.empty_split_datasets(builder_of(cfg, [24, 16, 16]).cls,
                                                [24, 16, 16], cfg)) == 1
