"""`mmp data train-tokenizer` saves a directory megatron-core and transformers load offline."""

from __future__ import annotations

import json
import os

import pytest

from tests.data.mmp_data_helpers import data_main, run_mmp, tokenizer_args


def test_loads_through_megatron_builder_offline(hf_tokenizer):
    from megatron_musa_patch.data import tokenizer

    names = sorted(os.listdir(hf_tokenizer))
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(names)
    tok = tokenizer.build(tokenizer_args(tokenizer_type="HuggingFaceTokenizer",
                                         tokenizer_model=hf_tokenizer))
    assert tok.vocab_size == 451 or 300 < tok.vocab_size <= 600
    assert tok.eod == 0  # the eos token is the first special token
    assert tok.pad == tok.vocab_size - 1  # the pad token is the last
    ids = tok.tokenize("naïve data 🙂")
    assert ids and tok.detokenize(ids) == "naïve data 🙂"  # byte-level: lossless
    config = json.load(open(os.path.join(hf_tokenizer, "tokenizer_config.json")))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["eos_token"] == "<|endoftext|>"


def test_autotokenizer_offline_in_fresh_process(hf_tokenizer):
    """No network, no cache: HF_HUB_OFFLINE=1 and an empty HF_HOME."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        code = ("import sys; from transformers import AutoTokenizer; "
                "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
                "print(t.eos_token_id, len(t), t('data shard').input_ids)")
        proc = subprocess.run([sys.executable, "-c", code, hf_tokenizer], capture_output=True,
                              text=True, env=dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=home,
                                                  TRANSFORMERS_OFFLINE="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    eos, size, ids = proc.stdout.split(" ", 2)
    assert eos == "0" and 300 < int(size) <= 600 and ids.startswith("[")


def test_special_tokens_and_errors(tmp_path, corpus_dir):
    out = tmp_path / "tok"
    assert data_main(["train-tokenizer", "--input", corpus_dir, "--output-dir", out,
                      "--vocab-size", 400, "--special-tokens", "<pad>", "<sep>"]) == 0
    model = json.load(open(out / "tokenizer.json"))
    added = {t["content"]: t["id"] for t in model["added_tokens"]}
    trained = len(model["model"]["vocab"])  # the pad token comes after them
    assert added == {"<|endoftext|>": 0, "<pad>": 1, "<sep>": 2, "<|pad|>": trained}
    assert trained <= 399
    # a pad token among --special-tokens keeps its place
    assert data_main(["train-tokenizer", "--input", corpus_dir, "--output-dir", out, "--force",
                      "--vocab-size", 400, "--special-tokens", "<pad>", "<sep>",
                      "--pad-token", "<pad>"]) == 0
    model = json.load(open(out / "tokenizer.json"))
    assert {t["content"]: t["id"] for t in model["added_tokens"]} == \
        {"<|endoftext|>": 0, "<pad>": 1, "<sep>": 2}
    assert json.load(open(out / "special_tokens_map.json"))["pad_token"] == "<pad>"
    # existing tokenizer without --force, too small a vocabulary: exit 2 with a message
    proc = run_mmp(["train-tokenizer", "--input", corpus_dir, "--output-dir", out])
    assert proc.returncode == 2 and "--force" in proc.stderr
    proc = run_mmp(["train-tokenizer", "--input", corpus_dir, "--output-dir", tmp_path / "t2",
                    "--vocab-size", 100])
    assert proc.returncode == 2 and "at least 258" in proc.stderr  # bytes, eos and pad


# ------------------------------------------------------------ the pad token, as Megatron sees it
#: megatron-core's MegatronDataset, when the tokenizer's pad id is also another special token's
PAD_WARNING = "pad token id in the tokenizer collides with another special token id"


def dataset_as_training_builds_it(tokenizer_dir, prefix, tmp_path):
    """megatron-core's tokenizer for --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR
    (its build_tokenizer, which pretrain_gpt.py calls) and the GPTDataset that
    BlendedMegatronDatasetBuilder makes with it, as pretrain_gpt.py's provider does; returns the
    tokenizer, the dataset and every warning and log record raised on the way."""
    import logging
    import warnings

    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from megatron_musa_patch.data import tokenizer

    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tok = tokenizer.build(tokenizer_args(tokenizer_type="HuggingFaceTokenizer",
                                                 tokenizer_model=tokenizer_dir))
            config = GPTDatasetConfig(
                random_seed=1234, sequence_length=32, blend=([str(prefix)], None),
                split="100,0,0", path_to_cache=str(tmp_path / "cache"), tokenizer=tok,
                reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                allow_ambiguous_pad_tokens=False)
            train, _, _ = BlendedMegatronDatasetBuilder(
                GPTDataset, [16, 0, 0], lambda: True, config).build()
    finally:
        root.removeHandler(handler)
    said = [str(w.message) for w in caught] + [r.getMessage() for r in records]
    return tok, train, said


def write_documents(tokenizer_dir, prefix):
    """A few documents tokenized with the tokenizer, each ending with its eod."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    eod = tok.token_to_id("<|endoftext|>")
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for i in range(40):
        ids = tok.encode(f"document {i}: the data model trains on a shard of the corpus").ids
        builder.add_document(np.asarray(ids + [eod], dtype=np.int64), [len(ids) + 1])
    builder.finalize(f"{prefix}.idx")
    return prefix


def test_megatron_takes_the_pad_token_without_the_collision_warning(tmp_path, corpus_dir,
                                                                     hf_tokenizer):
    prefix = write_documents(hf_tokenizer, tmp_path / "docs_text_document")
    tok, train, said = dataset_as_training_builds_it(hf_tokenizer, prefix, tmp_path)
    assert not [m for m in said if PAD_WARNING in m], said
    assert tok.eod == 0 and tok.pad == tok.vocab_size - 1  # eod where it was, pad a token apart
    assert train._pad_token_id == tok.pad  # the dataset kept the tokenizer's pad
    sample = train[0]
    assert (sample["labels"] == tok.eod).any()
    # eod is a token to learn, padding is not: only the pad id is masked out of the loss
    assert (sample["loss_mask"][sample["labels"] == tok.eod] == 1).all()

    # the same check sees the warning on a tokenizer whose pad is its eos (the old default)
    shared = tmp_path / "shared_pad"
    assert data_main(["train-tokenizer", "--input", corpus_dir / "train.jsonl", "--output-dir",
                      shared, "--vocab-size", "600", "--min-frequency", "1",
                      "--pad-token", "<|endoftext|>"]) == 0
    old, train, said = dataset_as_training_builds_it(str(shared), prefix, tmp_path / "old")
    assert [m for m in said if PAD_WARNING in m], said
    assert old.pad == old.eod == tok.eod and train._pad_token_id == -1


@pytest.mark.stock
def test_stock_pretrain_gpt_builds_its_data_without_the_pad_warning(lm_path, tmp_path,
                                                                    corpus_dir, hf_tokenizer):
    """pretrain_gpt.py itself, on data `mmp data prepare` wrote with the trained tokenizer: each
    tokenizer builder the release has (0.16 also keeps the legacy one) and the dataset it builds
    say nothing about the pad token; the tokenizer of the old default makes them say it."""
    from tests.harness.stock import run_stock

    prefix = tmp_path / "corpus"
    assert data_main(["prepare", "--input", corpus_dir / "train.jsonl", "--output-prefix", prefix,
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      hf_tokenizer, "--append-eod", "--no-progress"]) == 0

    def log_of(tokenizer_dir, *extra):
        _, _, log = run_stock(lm_path, [
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer_dir),
            "--data-path", f"{prefix}_text_document", "--split", "100,0,0",
            "--data-cache-path", str(tmp_path / "cache"), *extra], iters=1)
        assert "building train, validation, and test datasets" in log, log[-3000:]
        return log

    legacy = "--legacy-tokenizer" in (lm_path / "megatron/training/arguments.py").read_text()
    for extra in [()] + ([("--legacy-tokenizer",)] if legacy else []):
        log = log_of(hf_tokenizer, *extra)
        assert PAD_WARNING not in log, (extra, log[-3000:])
    shared = tmp_path / "shared_pad"
    assert data_main(["train-tokenizer", "--input", corpus_dir / "train.jsonl", "--output-dir",
                      shared, "--vocab-size", "600", "--min-frequency", "1",
                      "--pad-token", "<|endoftext|>"]) == 0
    assert PAD_WARNING in log_of(shared)
