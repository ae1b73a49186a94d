"""Bad input stops `mmp data prepare` with one paragraph naming the file, the line and the fix
(exit 2, no traceback); --skip-bad-lines counts and reports instead."""

from __future__ import annotations

import json
import os

import pytest

from tests.data.mmp_data_helpers import data_main, make_docs, read_pair, write_jsonl


def prepare(tmp_path, tok_dir, src, *extra):
    return run(["prepare", "--input", src, "--output-dir", tmp_path / "out",
                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok_dir,
                "--workers", 2, "--no-progress", *extra])


def run(argv):
    """``mmp data`` in-process: 0, or the DataError's one-line message."""
    from megatron_musa_patch.data.cli import main
    from megatron_musa_patch.data.errors import DataError

    try:
        return main([str(a) for a in argv])
    except DataError as exc:
        return " ".join(str(exc).split())


def corpus_with(tmp_path, bad: dict, n=120):
    """JSON lines with some lines (1-based numbers) replaced by raw text."""
    lines = [json.dumps(d) for d in make_docs(n, seed=21)]
    for number, text in bad.items():
        lines[number - 1] = text
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def no_outputs(tmp_path):
    out = tmp_path / "out"
    return not out.exists() or not [n for n in os.listdir(out) if n.endswith((".bin", ".idx"))]


def test_cli_prints_one_paragraph_and_exits_2(tmp_path, hf_tokenizer, capsys):
    src = corpus_with(tmp_path, {4: "{oops"})
    assert data_main(["prepare", "--input", src, "--output-dir", tmp_path / "out",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      hf_tokenizer, "--workers", 1, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mmp data prepare: error:") and "Traceback" not in err
    assert "in.jsonl:4:malformedJSON" in "".join(err.split())  # (wrapped at any space)


def test_malformed_json_names_file_and_line(tmp_path, hf_tokenizer, capsys):
    src = corpus_with(tmp_path, {97: '{"text": "unterminated'})
    # small chunks: line 97 sits deep inside a later chunk, its number must still be right
    err = prepare(tmp_path, hf_tokenizer, src, "--chunk-size", 1024)
    assert f"{src}:97: malformed JSON" in err and "--skip-bad-lines" in err
    assert no_outputs(tmp_path)
    assert not [n for n in os.listdir(tmp_path / "out") if ".mmp-tmp-" in n]


def test_missing_key(tmp_path, hf_tokenizer, capsys):
    src = corpus_with(tmp_path, {3: json.dumps({"body": "x"})})
    err = prepare(tmp_path, hf_tokenizer, src)
    assert f"{src}:3: the key 'text' is missing (keys here: 'body')" in err
    assert "--json-keys" in err


def test_wrong_value_type_and_bad_utf8(tmp_path, hf_tokenizer, capsys):
    src = corpus_with(tmp_path, {2: json.dumps({"text": 5})})
    err = prepare(tmp_path, hf_tokenizer, src)
    assert f"{src}:2: the value of 'text' is int" in err
    path = tmp_path / "utf.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')
    err = prepare(tmp_path, hf_tokenizer, str(path))
    assert f"{path}:2: not valid UTF-8" in err


def test_skip_bad_lines_counts_and_reports(tmp_path, hf_tokenizer, capsys):
    bad = {2: "{nope", 50: json.dumps({"body": "x"}), 51: "", 119: json.dumps([1, 2])}
    src = corpus_with(tmp_path, bad)
    assert data_main(["prepare", "--input", src, "--output-dir", tmp_path / "out",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      hf_tokenizer, "--workers", 2, "--chunk-size", 2048,
                      "--skip-bad-lines"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    # line 51 is blank: not a document, not an error
    assert "skipped 3 bad line(s)" in err
    assert f"{src}:2: malformed JSON" in err and f"{src}:50: the key 'text' is missing" in err
    docs, _ = read_pair(tmp_path / "out" / "in.jsonl_document")
    assert len(docs) == 120 - 4
    manifest = json.load(open(tmp_path / "out" / "in.jsonl_document.mmp.json"))
    assert manifest["skipped_lines"] == 3 and manifest["blank_lines"] == 1


def test_empty_file(tmp_path, hf_tokenizer, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    err = prepare(tmp_path, hf_tokenizer, str(empty))
    assert f"{empty}: the file is empty" in err
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n  \n")
    err = prepare(tmp_path, hf_tokenizer, str(blank))
    assert f"{blank}: no documents in the file" in err
    good = write_jsonl(tmp_path / "good.jsonl", make_docs(10))
    assert run(["prepare", "--input", empty, blank, good, "--output-dir", tmp_path / "out",
                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer,
                "--skip-bad-lines", "--no-progress"]) == 0
    assert sorted(n for n in os.listdir(tmp_path / "out") if n.endswith(".bin")) == [
        "good.jsonl_document.bin"]


def test_unreadable_and_missing_paths(tmp_path, hf_tokenizer, capsys, monkeypatch):
    err = prepare(tmp_path, hf_tokenizer, str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl: no such file or directory" in err
    err = prepare(tmp_path, hf_tokenizer, str(tmp_path / "none-*.jsonl"))
    assert "the glob matches nothing" in err
    locked = write_jsonl(tmp_path / "locked.jsonl", make_docs(3))
    real_open = open

    def fake_open(path, *a, **k):
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    err = prepare(tmp_path, hf_tokenizer, locked)
    assert f"{locked}: cannot read it (Permission denied)" in err


def test_tokenizer_that_fails_to_load(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(3))
    bogus = tmp_path / "not-a-tokenizer"
    bogus.mkdir()
    (bogus / "tokenizer.json").write_text("{broken")
    err = prepare(tmp_path, str(bogus), src)
    assert "could not load the tokenizer (--tokenizer-type HuggingFaceTokenizer" in err
    assert str(bogus) in err and "Fix:" in err
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "o",
                      "--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                      tmp_path / "missing.model"])
    assert "--tokenizer-model" in err


def test_ids_too_large_for_index_dtype(tmp_path, capsys):
    """NullTokenizer reports vocab 1001 (-> uint16 index) but the text holds id 70000."""
    rows = [{"text": "1 2 3"}, {"text": "4 5"}, {"text": "6 70000 7"}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    err = run(["prepare", "--input", src, "--output-prefix", tmp_path / "o",
               "--tokenizer-type", "NullTokenizer", "--vocab-size", 1000, "--workers", 1,
               "--no-progress"])
    assert f"{src}:3: the tokenizer produced id 70000, which does not fit the uint16 index" in err
    assert "--vocab-size" in err
    assert not os.path.exists(f"{tmp_path}/o_text_document.bin")


def test_tokenizer_failure_on_a_document(tmp_path, capsys):
    rows = [{"text": "1 2"}, {"text": "3  4"}, {"text": "5"}]  # two spaces: int('') fails
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    argv = ["prepare", "--input", src, "--output-prefix", tmp_path / "o", "--tokenizer-type",
            "NullTokenizer", "--vocab-size", 100, "--workers", 1, "--no-progress"]
    err = run(argv)
    assert f"{src}:2: the tokenizer failed on this document (ValueError" in err
    assert run(argv + ["--skip-bad-lines"]) == 0
    docs, _ = read_pair(tmp_path / "o_text_document")
    assert [d[0].tolist() for d in docs] == [[1, 2], [5]]


@pytest.mark.parametrize("flags, needle", [
    (["--split-sentences"], "--split-sentences: sentence splitting"),
    (["--partitions", "2"], "--partitions 2"),
    (["--legacy-tokenizer"], "--legacy-tokenizer"),
    (["--tokenizer-type", "MultimodalTokenizer"], "does not build it"),
])
def test_unsupported_flags_are_explained(tmp_path, hf_tokenizer, capsys, flags, needle):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(3))
    err = prepare(tmp_path, hf_tokenizer, src, *flags)
    assert needle in err


def test_output_naming_conflicts(tmp_path, hf_tokenizer, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = write_jsonl(tmp_path / "a" / "x.jsonl", make_docs(3))
    two = write_jsonl(tmp_path / "b" / "x.jsonl", make_docs(3))
    err = run(["prepare", "--input", one, two, "--output-dir", tmp_path / "out",
               "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer])
    assert "would both write" in err
    err = run(["prepare", "--input", one, two, "--output-prefix", tmp_path / "p",
               "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer])
    assert "--output-dir" in err
