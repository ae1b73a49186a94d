"""`mmp data blend`: weights from the shards, a DATA_PATH Megatron parses, damage caught."""

from __future__ import annotations

import os

import pytest

from tests.data.mmp_data_helpers import data_main, make_docs, read_pair, write_jsonl


@pytest.fixture(scope="module")
def shards(tmp_path_factory, hf_tokenizer):
    d = tmp_path_factory.mktemp("blend")
    (d / "in").mkdir()
    for name, n in (("x", 40), ("y", 10), ("z", 25)):
        write_jsonl(d / "in" / f"{name}.jsonl", make_docs(n, seed=n))
    assert data_main(["prepare", "--input", d / "in", "--output-dir", d / "out",
                      "--append-eod", "--tokenizer-type", "HuggingFaceTokenizer",
                      "--tokenizer-model", hf_tokenizer, "--workers", 2, "--no-progress"]) == 0
    return d / "out"


def counts(prefix):
    docs, _ = read_pair(prefix)
    return len(docs), sum(int(s.size) for d in docs for s in d)


def blend(argv, capsys):
    code = data_main(["blend"] + [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_weights_by_tokens_documents_uniform(shards, capsys):
    from megatron.core.datasets.utils import get_blend_from_list

    prefixes = [str(shards / f"{n}.jsonl_document") for n in ("x", "y", "z")]
    code, out, err = blend([shards], capsys)
    assert code == 0
    want = " ".join(f"{counts(p)[1]} {p}" for p in prefixes)
    assert out.strip() == want
    paths, weights = get_blend_from_list(out.split())
    assert paths == prefixes and weights == [float(counts(p)[1]) for p in prefixes]
    assert "documents" in err and "%" in err
    code, out, _ = blend(["--weight-by", "documents"] + [p + ".bin" for p in prefixes], capsys)
    assert out.split() == ["40", prefixes[0], "10", prefixes[1], "25", prefixes[2]]
    code, out, _ = blend(["--weight-by", "uniform", str(shards / "*.idx")], capsys)
    assert out.split()[::2] == ["1", "1", "1"]


def test_blend_does_not_import_megatron_core(shards):
    """blend reads indexes with indexfile: no seconds of megatron-core/torch start-up."""
    from tests.data.mmp_data_helpers import run_mmp_imports

    proc, heavy = run_mmp_imports(["blend", shards])
    assert proc.returncode == 0, proc.stderr
    assert heavy == [] and len(proc.stdout.split()) == 6 + 1  # 3 weights and prefixes, "[]"


def test_output_file_for_data_args_path(shards, tmp_path, capsys):
    from megatron.core.datasets.utils import get_blend_from_list

    target = tmp_path / "blend.txt"
    code, out, err = blend([shards, "--output", target], capsys)
    assert code == 0 and out == "" and "--data-args-path" in err
    lines = target.read_text().splitlines()
    assert len(lines) == 3 and lines[1].endswith("y.jsonl_document")
    paths, weights = get_blend_from_list(target.read_text().split())  # how Megatron reads it
    assert len(paths) == 3 and weights[0] > weights[1]


def test_damaged_and_empty_shards(shards, tmp_path, capsys):
    import shutil

    d = tmp_path / "mixed"
    shutil.copytree(shards, d)
    with open(d / "x.jsonl_document.bin", "r+b") as f:
        f.truncate(os.path.getsize(d / "x.jsonl_document.bin") - 2)  # lost its tail
    os.remove(d / "z.jsonl_document.idx")  # never finished
    code, out, err = blend([d], capsys)
    assert code == 2 and out == ""
    assert "x.jsonl_document: damaged (.bin is" in " ".join(err.split())
    assert "z.jsonl_document: .idx file missing" in err
    assert "--skip-bad-shards" in " ".join(err.split())
    code, out, err = blend([d, "--skip-bad-shards"], capsys)
    assert code == 0
    assert out.split()[1] == str(d / "y.jsonl_document") and len(out.split()) == 2
    assert "left out 2 shard(s)" in err


def test_bad_index_header_is_damage(shards, tmp_path, capsys):
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(shards, d)
    idx = d / "y.jsonl_document.idx"
    idx.write_bytes(b"NOTANIDX!" + idx.read_bytes()[9:])
    code, _, err = blend([d], capsys)
    assert code == 2
    assert "y.jsonl_document: damaged (IndexFormatError: bad header" in " ".join(err.split())


def test_empty_shard_and_missing_path(tmp_path, capsys):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    import numpy as np

    b = IndexedDatasetBuilder(str(tmp_path / "e.bin"), dtype=np.uint16)
    b.add_document([], [])
    b.finalize(str(tmp_path / "e.idx"))
    code, _, err = blend([tmp_path / "e"], capsys)
    assert code == 2 and "e: empty" in err
    code, _, err = blend([tmp_path / "nothing-here"], capsys)
    assert code == 2 and "no such prefix" in " ".join(err.split())
