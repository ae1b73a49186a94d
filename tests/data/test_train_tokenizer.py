"""`mmp data train-tokenizer` saves a directory megatron-core and transformers load offline."""

from __future__ import annotations

import json
import os

from tests.data.mmp_data_helpers import data_main, run_mmp, tokenizer_args


def test_loads_through_megatron_builder_offline(hf_tokenizer):
    from megatron_musa_patch.data import tokenizer

    names = sorted(os.listdir(hf_tokenizer))
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(names)
    tok = tokenizer.build(tokenizer_args(tokenizer_type="HuggingFaceTokenizer",
                                         tokenizer_model=hf_tokenizer))
    assert tok.vocab_size == 451 or 300 < tok.vocab_size <= 600
    assert tok.eod == 0  # the eos token is the first special token
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
    assert added == {"<|endoftext|>": 0, "<pad>": 1, "<sep>": 2}
    assert len(model["model"]["vocab"]) <= 400
    # existing tokenizer without --force, too small a vocabulary: exit 2 with a message
    proc = run_mmp(["train-tokenizer", "--input", corpus_dir, "--output-dir", out])
    assert proc.returncode == 2 and "--force" in proc.stderr
    proc = run_mmp(["train-tokenizer", "--input", corpus_dir, "--output-dir", tmp_path / "t2",
                    "--vocab-size", 100])
    assert proc.returncode == 2 and "at least 257" in proc.stderr
