"""The light start-up of `mmp data prepare`: tokenizer.json loaded with `tokenizers` alone, checked
against megatron-core's builder once (in a subprocess on first use, then cached), with outputs
identical to the builder's either way, and a redo when the check disagrees."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.data.mmp_data_helpers import (data_main, make_docs, reference_pairs, run_mmp_imports,
                                         same_files, tokenizer_args, write_jsonl)


def hf_args(model, **kw):
    return tokenizer_args(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=model, **kw)


def build_tok(model, **kw):
    from megatron_musa_patch.data import tokenizer

    return tokenizer.build(hf_args(model, **kw))


def assert_same_as_reference(tmp_path, src, model, out="out"):
    (ref,) = reference_pairs(src, tmp_path / f"ref_{out}", build_tok(model), append_eod=True)
    for ext in (".bin", ".idx"):
        assert same_files(f"{tmp_path}/{out}_text_document{ext}", ref + ext), ext


def prepare_args(src, prefix, model, *extra):
    from megatron_musa_patch.data.cli import parser

    return parser().parse_args(["prepare", "--input", str(src), "--output-prefix", str(prefix),
                                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                str(model), "--append-eod", "--workers", "2", "--chunk-size",
                                "4096", *map(str, extra)])


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("MMP_CACHE_DIR", str(path))
    return path / "tokenizer-checks"


@pytest.fixture
def no_megatron_here(monkeypatch):
    """Make prepare behave as in a fresh `mmp` process: megatron-core is not imported yet, so the
    check runs in a subprocess while the work goes on."""
    from megatron_musa_patch.data import prepare

    monkeypatch.setattr(prepare, "_megatron_core_loaded", lambda: False)


def test_first_run_checks_then_the_cache_imports_nothing_heavy(tmp_path, hf_tokenizer,
                                                               fresh_cache):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(300, seed=21))
    argv = ["prepare", "--input", src, "--output-prefix", tmp_path / "out", "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer, "--append-eod",
            "--workers", 2, "--chunk-size", 4096, "--force"]
    env = {"MMP_CACHE_DIR": str(fresh_cache.parent)}
    first, _ = run_mmp_imports(argv, env=env)
    assert first.returncode == 0, first.stderr
    assert "checking it against megatron-core's builder meanwhile (first use)" in first.stderr
    (record_file,) = fresh_cache.glob("*.json")
    record = json.loads(record_file.read_text())
    tok = build_tok(hf_tokenizer)
    assert record["ok"] is True and record["eod"] == tok.eod == 0
    assert record["vocab_size"] == tok.vocab_size and 256 < tok.vocab_size <= 600
    assert_same_as_reference(tmp_path, src, hf_tokenizer)

    second, heavy = run_mmp_imports(argv, env=env)
    assert second.returncode == 0, second.stderr
    assert "tokenizer.json alone, checked against megatron-core's builder" in second.stderr
    assert "meanwhile" not in second.stderr
    assert heavy == [], f"the cached path imported {heavy}"
    assert_same_as_reference(tmp_path, src, hf_tokenizer)


def test_a_wrong_guess_is_redone_with_the_checks_answer(tmp_path, hf_tokenizer, fresh_cache,
                                                        no_megatron_here, monkeypatch):
    """The values read from tokenizer_config.json are only a guess: when megatron-core's builder
    says otherwise (here: another eod), nothing of the first attempt is kept."""
    import dataclasses

    from megatron_musa_patch.data import light, prepare

    real_guess = light.guess
    monkeypatch.setattr(light, "guess", lambda path, args: dataclasses.replace(
        real_guess(path, args), eod=7))
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(200, seed=22))
    messages = []

    class Stream:
        def write(self, text):
            messages.append(text)

        def flush(self):
            pass

    summary = prepare.run(prepare_args(src, tmp_path / "out", hf_tokenizer), stream=Stream())
    text = "".join(messages)
    assert summary.redone and summary.tokenizer_source == "light-checked"
    assert "megatron-core's builder disagrees" in text and "redoing the run" in text
    assert_same_as_reference(tmp_path, src, hf_tokenizer)
    assert not [n for n in os.listdir(tmp_path) if ".mmp-tmp-" in n]


def test_tokens_transformers_adds_send_the_run_to_the_builder(tmp_path, hf_tokenizer,
                                                              fresh_cache, no_megatron_here):
    """A config that makes transformers add a token to the backend (so tokenizer.json alone
    would split it): the check says no, the run is redone with megatron-core's builder, and the
    record keeps later runs on the builder from the start."""
    from megatron_musa_patch.data import prepare

    model = tmp_path / "tok"
    shutil.copytree(hf_tokenizer, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["additional_special_tokens"] = ["<|newtok|>"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    docs = make_docs(120, seed=23)
    docs[3]["text"] = "before <|newtok|> after"
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    summary = prepare.run(prepare_args(src, tmp_path / "out", model, "--no-progress"))
    assert summary.redone and summary.tokenizer_source == "builder"
    tok, base = build_tok(str(model)), build_tok(hf_tokenizer).vocab_size
    assert tok.vocab_size == base + 1 and base in tok.tokenize("x <|newtok|> y")
    assert_same_as_reference(tmp_path, src, str(model))
    (record_file,) = fresh_cache.glob("*.json")
    record = json.loads(record_file.read_text())
    assert record["ok"] is False and "adds tokens" in record["why"]
    again = prepare.run(prepare_args(src, tmp_path / "out", model, "--no-progress", "--force"))
    assert not again.redone and again.tokenizer_source == "builder"


def test_a_tokenizer_the_builder_cannot_load_fails_clearly(tmp_path, hf_tokenizer, fresh_cache,
                                                           no_megatron_here, capsys):
    """tokenizer.json loads, the rest of the directory does not: the check reports the builder's
    error, as the builder path would have, and nothing is written."""
    model = tmp_path / "tok"
    shutil.copytree(hf_tokenizer, model)
    (model / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast",')
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(50, seed=24))
    code = data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "out",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", model,
                      "--append-eod", "--workers", 2, "--no-progress"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "could not load the tokenizer (--tokenizer-type HuggingFaceTokenizer" in err
    assert "Unable to instantiate HuggingFace AutoTokenizer" in err and "Fix:" in err
    assert not [n for n in os.listdir(tmp_path) if n.startswith("out")]
    assert not list(fresh_cache.glob("*.json"))  # a failure is not remembered


def test_exact_tokenize_and_other_tokenizers_use_the_builder(tmp_path, hf_tokenizer, sp_model):
    from megatron_musa_patch.data import light, prepare

    src = write_jsonl(tmp_path / "in.jsonl", make_docs(40, seed=25))
    summary = prepare.run(prepare_args(src, tmp_path / "out", hf_tokenizer, "--exact-tokenize",
                                       "--no-progress"))
    assert summary.tokenizer_source == "builder" and summary.encoder_path == "generic"
    assert light.tokenizer_json(tokenizer_args(tokenizer_type="SentencePieceTokenizer",
                                               tokenizer_model=sp_model)) is None
    assert light.tokenizer_json(hf_args(hf_tokenizer, tokenizer_special_tokens=["<x>"])) is None
    assert light.tokenizer_json(hf_args("gpt2")) is None  # a hub id: the builder decides
    assert light.tokenizer_json(hf_args(hf_tokenizer)) == os.path.join(hf_tokenizer,
                                                                      "tokenizer.json")


def test_the_check_records_what_the_builder_says(hf_tokenizer, fresh_cache, release):
    from megatron_musa_patch.data import light, tokenizer

    args = hf_args(hf_tokenizer)
    record = light.check_in_process(args)
    tok = tokenizer.build(args)
    hf = tok._tokenizer.tokenizer
    assert record["ok"] is True
    assert (record["eod"], record["vocab_size"]) == (tok.eod, tok.vocab_size) == (0, len(hf))
    # upstream's default: tokenize() (no special tokens) on 0.16, tokenizer(text) from 0.17
    with_special = tok._tokenizer.include_special_tokens
    assert with_special is (release.series != "0.16")
    assert record["params"] == {"with_special": with_special, "split_special": False,
                                "size": len(hf), "unk": hf.unk_token_id}
    spec = light.spec_from_record(light.tokenizer_json(args), record)
    assert light.same_as_guess(light.guess(spec.tokenizer_json, args), record)
    encoder = light.LightEncoder(spec)
    texts = ["Hello world", "", "数据 <|endoftext|> x", "def f(x):\n    return x"]
    flat, lens = encoder.encode(texts)
    assert lens.tolist() == [len(tok.tokenize(t)) for t in texts]
    assert flat.tolist() == [i for t in texts for i in tok.tokenize(t)]
    # the cache: keyed by the fingerprint, a damaged file is as good as none
    key = light.record_key(tokenizer.fingerprint(args))
    light.save_record(key, record)
    assert light.load_record(key) == record
    (fresh_cache / f"{key}.json").write_text("{not json")
    assert light.load_record(key) is None
    changed = tokenizer.fingerprint(args)
    changed["versions"]["tokenizers"] = "0.0.0"
    assert light.record_key(changed) != key


def test_a_spawned_worker_builds_the_light_encoder(hf_tokenizer):
    """Platforms without fork: the worker builds from the LightSpec, not megatron-core."""
    from megatron_musa_patch.data import encode, light

    # tokenize() (the piece cache's case), not the 0.17+ default tokenizer(text)
    args = hf_args(hf_tokenizer, tokenizer_hf_include_special_tokens=False)
    spec = light.guess(light.tokenizer_json(args), args)
    settings = encode.Settings(("text",), True, False, "uint16", spec.eod, spec.vocab_size)
    saved = dict(encode._STATE)
    try:
        encode._STATE.clear()
        encode.init_worker(settings, spec)
        worker_encoder = encode._STATE["encoder"]
        assert isinstance(worker_encoder, light.LightEncoder)
        assert worker_encoder.path == "hf-piece-cache"
        flat, lens = worker_encoder.encode(["a b", "c"])
        assert lens.tolist() == [len(build_tok(hf_tokenizer).tokenize(t)) for t in ("a b", "c")]
        assert flat.dtype == np.int64
    finally:
        encode._STATE.clear()
        encode._STATE.update(saved)


def test_the_check_subprocess_gives_the_same_record_without_torch_compile(hf_tokenizer,
                                                                          fresh_cache):
    """The helper process leaves ``torch.compile`` out of megatron-core's import (dynamo and
    inductor: about 2 s of its time), and its record is the in-process check's."""
    import subprocess
    import sys

    from megatron_musa_patch.data import light, tokenizer

    args = hf_args(hf_tokenizer)
    flags = json.dumps(vars(tokenizer.builder_args(args)))
    code = ("import sys; from megatron_musa_patch.data.light import _check_main; _check_main(); "
            "print('dynamo imported:', 'torch._dynamo' in sys.modules)")
    env = dict(os.environ, MEGATRON_MUSA_PATCH="0", MEGATRON_MUSA_PATCH_AUTOACTIVATE="0")
    proc = subprocess.run([sys.executable, "-c", code], input=flags, capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *_, answer, dynamo = proc.stdout.strip().splitlines()
    assert dynamo == "dynamo imported: False"
    assert json.loads(answer) == {"record": json.loads(json.dumps(light.check_in_process(args)))}


def test_a_small_first_use_lets_the_check_have_the_cpu():
    from megatron_musa_patch.data import prepare

    checking = prepare.Chosen(0, 10, None, None, "light-checking", pending=object())
    checked = prepare.Chosen(0, 10, None, None, "light-checked")
    small, large = 17 << 20, 2 * prepare.CHECK_OUTLASTS_WORK * 2
    assert prepare._worker_niceness(checking, small, 2) == prepare.YIELD_TO_CHECK > 0
    assert prepare._worker_niceness(checking, large, 2) == 0  # the work is the long part
    assert prepare._worker_niceness(checked, small, 2) == 0   # nothing to wait for
