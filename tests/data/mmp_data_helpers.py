"""Helpers of the ``mmp data`` tests: corpora, running the CLI, reading pairs, and the oracle
(preprocess_data.py's algorithm run with megatron-core's builder)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np

os.environ.setdefault("MEGATRON_MUSA_PATCH_AUTOACTIVATE", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORDS = ("the of and to in is was for on that with as by at from it an be this are which "
         "data model token train megatron musa patch binarize blend index shard corpus "
         "naïve café straße 数据 训练 データ 🙂 — “quoted” x**2 def return {} [] 0 1 42 3.14").split()


def make_text(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        w = rng.choice(WORDS)
        r = rng.random()
        if r < 0.05:
            w += "\n"
        elif r < 0.08:
            w += "  "
        elif r < 0.1:
            w += "\t"
        elif r < 0.11:
            w = "<|endoftext|>"
        out.append(w)
    return " ".join(out)


def make_docs(n: int, seed: int = 0, sentences: bool = False, empties: bool = True):
    """``{"text": ...}`` documents of varied length; some empty, some sentence lists."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        if empties and i % 17 == 5:
            text = ""
        elif i % 97 == 3:
            text = make_text(rng, 2000)  # longer than a small chunk
        else:
            text = make_text(rng, rng.randint(1, 60))
        if sentences and i % 3 == 0:
            text = [make_text(rng, rng.randint(0, 8)) for _ in range(rng.randint(0, 4))]
            if text:
                text[0] = ""  # a sentence that tokenizes to nothing
        docs.append({"text": text, "id": i, "title": make_text(rng, 3)})
    return docs


def write_jsonl(path, docs) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=bool(d.get("id", 0) % 2)) + "\n")
    return str(path)


def data_main(argv) -> int:
    """``mmp data ...`` in this process, through the top-level CLI (errors -> exit 2)."""
    from megatron_musa_patch.cli.main import main

    return main(["data"] + [str(a) for a in argv])


def run_mmp(argv, env=None, **kwargs) -> subprocess.CompletedProcess:
    """``mmp data ...`` in a fresh process (for settings read at import, such as HF_HOME)."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"
    code = ("import sys; from megatron_musa_patch.cli.main import main; "
            "sys.exit(main(['data'] + sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code] + [str(a) for a in argv], env=full_env,
                          capture_output=True, text=True, **kwargs)


HEAVY = ("torch", "megatron.core", "transformers")


def run_mmp_imports(argv, env=None, **kwargs):
    """``mmp data ...`` in a fresh process; returns (process, the HEAVY modules it imported)."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"
    code = ("import json, sys; from megatron_musa_patch.cli.main import main; "
            "rc = main(['data'] + sys.argv[1:]); "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules])); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code] + [str(a) for a in argv], env=full_env,
                          capture_output=True, text=True, **kwargs)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else None)


def read_pair(prefix):
    """Documents of a pair as lists of numpy arrays, read with megatron-core's IndexedDataset."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix), mmap=False)
    docs = ds.document_indices
    out = [[np.asarray(ds[j]) for j in range(docs[i], docs[i + 1])] for i in range(len(docs) - 1)]
    return out, ds.index.dtype


def tokenizer_args(**kw):
    """An argparse namespace with preprocess_data.py's tokenizer defaults."""
    import argparse

    from megatron_musa_patch.data import tokenizer

    p = argparse.ArgumentParser()
    tokenizer.add_arguments(p)
    args = p.parse_args([])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def reference_pairs(path, prefix, tok, keys=("text",), append_eod=False):
    """What tools/preprocess_data.py writes, computed the way its Encoder and its main loop do
    (text-mode read, json.loads per line, tokenize per sentence, add_document per line) — the
    oracle when no Megatron-LM checkout is at hand."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    builders = {k: IndexedDatasetBuilder(f"{prefix}_{k}_document.bin",
                                         dtype=DType.optimal_dtype(tok.vocab_size))
                for k in keys}
    with open(path, "r", encoding="utf-8") as fin:
        for line in fin:
            data = json.loads(line)
            for key in keys:
                text = data[key]
                sentences = text if isinstance(text, list) else [text]
                doc_ids, lens = [], []
                for s in sentences:
                    ids = tok.tokenize(s)
                    if len(ids) > 0:
                        doc_ids.extend(ids)
                        lens.append(len(ids))
                if len(doc_ids) > 0 and append_eod:
                    doc_ids.append(tok.eod)
                    lens[-1] += 1
                builders[key].add_document(doc_ids, lens)
    for k in keys:
        builders[k].finalize(f"{prefix}_{k}_document.idx")
    return [f"{prefix}_{k}_document" for k in keys]


def same_files(a, b) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


