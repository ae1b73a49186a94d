"""Bad training data stops the stock pretrain_gpt.py (core_v0.16.1, unmodified) at start-up with
one paragraph naming the --data-path prefix and the fix, a non-zero exit, and no checkpoint
written (the catalogue is docs/bad_inputs.md; the fast checks are tests/project/test_bad_inputs.py).
Needs MEGATRON_LM_PATH."""

import re

import pytest

from tests.harness.stock import run_stock, write_bin_idx

pytestmark = pytest.mark.stock


def fails(lm_path, tmp_path, prefix, *more, timeout=900):
    args = ["--data-path", str(prefix), "--split", "100,0,0",
            "--data-cache-path", str(tmp_path / "cache"), "--save", str(tmp_path / "ckpt"),
            "--save-interval", "1", *more]
    with pytest.raises(AssertionError) as failed:
        run_stock(lm_path, args, iters=2, timeout=timeout)
    # torchrun prefixes each line of a rank's error with "[rankN]: "
    text = " ".join(re.sub(r"\[rank\d+\]: ", "", str(failed.value)).split())
    assert "exited 1" in text and "Traceback" not in text.split("megatron_musa_patch: error:")[1]
    assert not (tmp_path / "ckpt").exists()  # nothing trained, nothing saved
    return text


def test_data_from_another_vocabulary_stops_the_stock_script(lm_path, tmp_path, release):
    # the tiny model's NullTokenizer (--vocab-size 1000) has 1001 ids on 0.16 (eod added) and
    # 1000 from 0.17 (eod is the last of them); this data has 4000
    vocab = 1001 if release.series == "0.16" else 1000
    prefix = write_bin_idx(tmp_path / "wide_text_document", documents=200, max_id=4000)
    text = fails(lm_path, tmp_path, prefix)
    assert f"megatron_musa_patch: error: --data-path {prefix}: token id" in text
    assert f"is outside the training tokenizer's vocabulary (NullTokenizer, vocab_size {vocab})" \
        in text
    assert "--tokenizer-model" in text


def test_missing_data_path_stops_the_stock_script(lm_path, tmp_path):
    prefix = tmp_path / "no_such_text_document"
    text = fails(lm_path, tmp_path, prefix)
    assert f"megatron_musa_patch: error: --data-path {prefix}: no such .bin/.idx pair" in text


@pytest.mark.ci
def test_split_that_leaves_the_validation_set_no_document(lm_path, tmp_path):
    """50 documents, --split 99,1,0 and evaluation asked for: the validation share rounds to no
    document, and upstream spins building that dataset's index for ever (its log stops at
    "building train, validation, and test datasets for GPT"). Here rank 0 says so once, before
    any index is built, and the job ends with exit status 1 within the time limit."""
    prefix = write_bin_idx(tmp_path / "small_text_document", documents=50)
    text = fails(lm_path, tmp_path, prefix, "--split", "99,1,0", "--eval-iters", "2",
                 "--eval-interval", "2", timeout=240)
    # (2 // 2 + 1) evaluations x 2 iterations x 8 sequences
    assert (f"megatron_musa_patch: error: --split 99,1,0 gives the validation split the share "
            f"0.99 to 1 of --data-path {prefix}, which has 50 documents: that share rounds to "
            f"none of them (documents 50 to 50). megatron-core still builds that validation "
            f"dataset (asked for 32 samples)") in text
    assert ("Fix: a validation share that reaches at least one of the 50 documents, more "
            "documents, or no evaluation: --eval-iters 0 with --split 100,0,0.") in text
    assert text.count("megatron_musa_patch: error:") == 1  # rank 1 is stopped, not repeating it
    assert "rank 1 (killed by SIGTERM)" in text
    assert not list((tmp_path / "cache").rglob("*.npy"))  # refused before any index was built
