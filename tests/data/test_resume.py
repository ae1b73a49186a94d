"""Outputs appear atomically; a rerun skips finished pairs (same input and settings) and redoes
the rest; an interrupted run leaves nothing that looks complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.data.mmp_data_helpers import REPO, data_main, make_docs, read_pair, write_jsonl


def argv(src_dir, out, tok, *extra):
    return ["prepare", "--input", src_dir, "--output-dir", out, "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", tok, "--workers", 2, "--no-progress",
            *extra]


def run(a):
    from megatron_musa_patch.data import prepare
    from megatron_musa_patch.data.cli import parser

    return prepare.run(parser().parse_args([str(x) for x in a]))


@pytest.fixture
def three(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    for i, name in enumerate(("a", "b", "c")):
        write_jsonl(d / f"{name}.jsonl", make_docs(30 + i, seed=30 + i))
    return d


def mtimes(out):
    return {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)
            if n.endswith((".bin", ".idx"))}


def test_rerun_skips_done_and_redoes_changed(tmp_path, three, hf_tokenizer):
    out = tmp_path / "out"
    first = run(argv(three, out, hf_tokenizer))
    assert len(first.written) == 3 and not first.skipped_done
    before = mtimes(out)
    again = run(argv(three, out, hf_tokenizer))
    assert not again.written and len(again.skipped_done) == 3
    assert mtimes(out) == before
    # change one input: only it is redone
    write_jsonl(three / "b.jsonl", make_docs(12, seed=99))
    third = run(argv(three, out, hf_tokenizer))
    assert [p.file.name for p in third.written] == ["b.jsonl"]
    docs, _ = read_pair(out / "b.jsonl_document")
    assert len(docs) == 12
    # change a setting that changes the ids: everything is redone
    fourth = run(argv(three, out, hf_tokenizer, "--append-eod"))
    assert len(fourth.written) == 3
    # --force rebuilds regardless
    assert len(run(argv(three, out, hf_tokenizer, "--append-eod", "--force")).written) == 3


def test_damaged_or_incomplete_pair_is_redone(tmp_path, three, hf_tokenizer):
    out = tmp_path / "out"
    run(argv(three, out, hf_tokenizer))
    good = (out / "a.jsonl_document.bin").read_bytes()
    # a truncated .bin and a missing .idx (what an interrupted copy or run could leave)
    with open(out / "a.jsonl_document.bin", "r+b") as f:
        f.truncate(10)
    os.remove(out / "c.jsonl_document.idx")
    again = run(argv(three, out, hf_tokenizer))
    assert sorted(p.file.name for p in again.written) == ["a.jsonl", "c.jsonl"]
    assert (out / "a.jsonl_document.bin").read_bytes() == good
    assert (out / "c.jsonl_document.idx").exists()


def test_failure_midway_leaves_no_pair_and_no_temporaries(tmp_path, hf_tokenizer, monkeypatch):
    from megatron_musa_patch.data import writer

    src = write_jsonl(tmp_path / "in.jsonl", make_docs(300, seed=3))
    calls = []
    real_add = writer.PairWriter.add

    def add_then_fail(self, packed):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as if Ctrl-C arrived while writing
        return real_add(self, packed)

    monkeypatch.setattr(writer.PairWriter, "add", add_then_fail)
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "o",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      hf_tokenizer, "--workers", 2, "--chunk-size", 2048,
                      "--no-progress"]) == 130
    assert len(calls) == 3
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_killed_run_leaves_no_complete_looking_pair(tmp_path, hf_tokenizer):
    """SIGKILL in the middle: no final .bin/.idx pair; the rerun cleans the temporaries."""
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(6000, seed=4))
    env = dict(os.environ, PYTHONPATH=REPO, MEGATRON_MUSA_PATCH_AUTOACTIVATE="0")
    code = ("import sys; from megatron_musa_patch.cli.main import main; "
            "sys.exit(main(['data'] + sys.argv[1:]))")
    a = [str(x) for x in ["prepare", "--input", src, "--output-prefix", tmp_path / "o",
                          "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                          hf_tokenizer, "--workers", 1, "--chunk-size", 4096, "--no-progress"]]
    proc = subprocess.Popen([sys.executable, "-c", code] + a, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and not any(".mmp-tmp-" in n for n in os.listdir(tmp_path)):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers, before they finish
    proc.wait()
    names = os.listdir(tmp_path)
    assert any(".mmp-tmp-" in n for n in names), names
    assert "o_text_document.idx" not in names and "o_text_document.mmp.json" not in names
    summary = run(["prepare", "--input", src, "--output-prefix", tmp_path / "o",
                   "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                   hf_tokenizer, "--workers", 2, "--no-progress"])
    assert len(summary.written) == 1
    assert not [n for n in os.listdir(tmp_path) if ".mmp-tmp-" in n]
    docs, _ = read_pair(tmp_path / "o_text_document")
    assert len(docs) == 6000
