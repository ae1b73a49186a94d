"""A Hugging Face tokenizer directory loaded with ``tokenizers`` alone, checked against
megatron-core's builder once per tokenizer.

Why: megatron-core's builder (what ``pretrain_gpt.py`` and ``preprocess_data.py`` use) costs
``import megatron.core`` plus transformers' ``AutoTokenizer``, which import torch: seconds, more
than tokenizing a small corpus takes (docs/benchmarks.md, data preparation). Yet for a fast
tokenizer the ids come from the Rust backend in ``tokenizer.json`` (``tokenizer.hf_encoder``); megatron-core and
transformers only decide how it is configured, the ``eod`` id and the vocabulary size.

How it stays exact: a *check* (:func:`check_in_process`) builds the tokenizer the exact way and
records what the fast path takes from it -- eod, vocab size, :class:`tokenizer.HFParams`, the
sha256 of the backend as transformers configured it -- after making sure that ``tokenizer.json``
loaded here is that same backend and gives ``tokenize``'s ids on the probe texts, and that
``indexfile`` writes what the installed megatron-core writes. The record is stored under the
tokenizer's fingerprint (its flags, the content of its files, the versions of megatron-core,
transformers and tokenizers: ``tokenizer.fingerprint``, what the manifests already trust) in
``$MMP_CACHE_DIR/tokenizer-checks`` (default ``~/.cache/megatron_musa_patch``). Then:

* a record says yes: nothing of megatron-core, transformers or torch is imported;
* a record says no (e.g. transformers adds tokens to the backend): the exact path;
* no record yet (the first run with this tokenizer): the check runs in a subprocess started
  before anything else, while the work runs on values read from ``tokenizer_config.json``;
  nothing is committed until it answers, and a disagreement redoes the run with its answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Optional

from megatron_musa_patch.base.env_names import ACTIVATE_ENV, AUTOACTIVATE_ENV

from .errors import DataError
from .tokenizer import (PROBES, HFParams, canonical_table, configure_backend, fingerprint,
                        hf_encoder)

FORMAT = 1
CACHE_ENV = "MMP_CACHE_DIR"
FAST_PATHS = ("hf-piece-cache", "hf-batch")


# ------------------------------------------------------------------ which runs qualify
def tokenizer_json(args) -> Optional[str]:
    """``<dir>/tokenizer.json`` when these flags build a HF tokenizer from that directory and
    nothing else (no extra vocab/merges/special-token flags, no remote code), else None."""
    if args.tokenizer_type != "HuggingFaceTokenizer" or getattr(args, "legacy_tokenizer", False):
        return None
    if (args.vocab_file or args.merge_file or args.tokenizer_special_tokens
            or args.trust_remote_code or args.tokenizer_metadata or not args.tokenizer_model):
        return None
    path = os.path.join(args.tokenizer_model, "tokenizer.json")
    if not os.path.isfile(path):
        return None  # a hub id or a slow-only directory: megatron-core's builder decides
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return None
    return os.path.abspath(path)


@dataclass(frozen=True)
class LightSpec:
    """Everything a worker needs to build the encoder (picklable, for spawned workers)."""
    tokenizer_json: str
    params: HFParams
    eod: Optional[int]
    vocab_size: int
    backend_sha256: str


class LightEncoder:
    """``encode(texts) -> (flat ids, lengths)`` like ``tokenizer.TextEncoder``, on the backend
    loaded from ``tokenizer.json``."""

    def __init__(self, spec: LightSpec, verify: bool = True):
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(spec.tokenizer_json)
        configure_backend(backend, spec.params)
        self.backend_sha256 = backend_sha256(backend)
        if verify and self.backend_sha256 != spec.backend_sha256:
            raise DataError(f"{spec.tokenizer_json} changed while it was being used (its "
                            "backend differs from the one checked). Fix: rerun.")
        self.spec = spec
        self.path, self.encode = hf_encoder(backend, spec.params)


def backend_sha256(backend) -> str:
    return hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()


# ------------------------------------------------------------------ the record cache
def cache_dir() -> str:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "megatron_musa_patch")
    return os.path.join(base, "tokenizer-checks")


def record_key(fingerprint: dict) -> str:
    blob = json.dumps({"format": FORMAT, "fingerprint": fingerprint}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def load_record(key: str) -> Optional[dict]:
    try:
        with open(os.path.join(cache_dir(), key + ".json"), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def save_record(key: str, record: dict) -> None:
    """Best effort: an unwritable cache only means the check runs again next time."""
    directory = cache_dir()
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=key, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(directory, key + ".json"))
    except OSError:
        pass


def spec_from_record(path: str, record: dict) -> LightSpec:
    return LightSpec(path, HFParams(**record["params"]), record["eod"], record["vocab_size"],
                     record["backend_sha256"])


def checked_ids(args) -> Optional[dict]:
    """``{"eod": ..., "vocab_size": ..., "record": key}`` of these tokenizer flags, as
    megatron-core's builder gives them, from the check record ``mmp data prepare`` stored (under
    ``key``); None without a record that says yes. For a training script that needs only those
    two (megatron-core's ``GPTDataset``): it imports neither megatron-core's tokenizers nor
    transformers (seconds a rank)."""
    if tokenizer_json(args) is None:
        return None
    key = record_key(fingerprint(args))
    record = load_record(key)
    if record is None or not record.get("ok"):
        return None
    return {"eod": record["eod"], "vocab_size": record["vocab_size"], "record": key}


# ------------------------------------------------------------------ the guess (no record yet)
def guess(path: str, args) -> Optional[LightSpec]:
    """What megatron-core's builder will most likely say, from the directory's JSON files (how
    transformers reads the special tokens), or None when that is not clear enough to try."""
    from tokenizers import Tokenizer

    directory = os.path.dirname(path)
    config = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                loaded = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(loaded, dict):
            config.update(loaded)

    def token(name):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else None

    backend = Tokenizer.from_file(path)
    eos, unk = token("eos_token"), token("unk_token")
    eod = backend.token_to_id(eos) if eos is not None else None
    if eod is None:
        return None  # the builder would pick another token, or none: leave it to the builder
    from .tokenizer import builder_args

    # unset, the flag means the installed release's default (0.16: off, 0.17+: on)
    params = HFParams(with_special=bool(builder_args(args).tokenizer_hf_include_special_tokens),
                      split_special=bool(config.get("split_special_tokens", False)),
                      size=backend.get_vocab_size(with_added_tokens=True),
                      unk=backend.token_to_id(unk) if unk is not None else None)
    configure_backend(backend, params)
    return LightSpec(path, params, eod, params.size, backend_sha256(backend))


# ------------------------------------------------------------------ the check
def check_in_process(args) -> dict:
    """Build the tokenizer with megatron-core's builder and record what the light path needs
    (``ok``), or why it cannot stand in for it (``why``). A tokenizer that does not load raises
    the builder's DataError."""
    from . import tokenizer as tk

    path = tokenizer_json(args)
    tok = tk.build(args)
    encoder = tk.TextEncoder(tok)
    record = {"format": FORMAT, "ok": False, "eod": tok.eod, "vocab_size": tok.vocab_size}
    if encoder.path not in FAST_PATHS or encoder.hf_params is None or path is None:
        record["why"] = f"megatron-core's tokenizer takes the {encoder.path} path here"
        return record
    params = encoder.hf_params
    if canonical_table(encoder.hf_backend, params) is not None:
        record["why"] = "some token strings name other ids (the exact tokenizer is needed)"
        return record
    record.update(params=dataclasses.asdict(params),
                  backend_sha256=backend_sha256(encoder.hf_backend))
    spec = spec_from_record(path, record)
    try:
        light = LightEncoder(spec)
    except DataError:
        record["why"] = ("transformers configures the backend differently from tokenizer.json "
                         "(e.g. it adds tokens)")
        return record
    if light.path != encoder.path:
        record["why"] = (f"the backend alone takes the {light.path} path, the builder's "
                         f"{encoder.path}")
        return record
    import numpy as np

    want, got = encoder._encode_generic(PROBES), light.encode(PROBES)  # tokenize, text by text
    if not all(np.array_equal(a, b) for a, b in zip(want, got)):
        record["why"] = "tokenizer.json alone gives other ids than the builder on the probes"
        return record
    problem = _index_format_problem(tok.vocab_size)
    if problem:
        record["why"] = problem
        return record
    record["ok"] = True
    return record


def _index_format_problem(vocab_size) -> Optional[str]:
    """Whether ``indexfile`` writes and picks what the installed megatron-core does."""
    import warnings

    import numpy as np

    from . import indexfile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron.core's import warns about TE/Apex
        from megatron.core.datasets import indexed_dataset as upstream
    if getattr(upstream, "_INDEX_HEADER", None) != indexfile.MAGIC:
        return "megatron-core's index header is not the one indexfile writes"
    for name, code in indexfile.CODES.items():
        if upstream.DType[name].value != code:
            return f"megatron-core's dtype code for {name} differs from indexfile's"
    for v in (None, 0, 65499, 65500, 1 << 20, vocab_size):
        if upstream.DType.optimal_dtype(v) is not indexfile.optimal_dtype(v):
            return f"megatron-core picks another token dtype for vocab size {v}"
    with tempfile.TemporaryDirectory() as d:
        for dtype in (np.uint16, np.int32):
            builder = upstream.IndexedDatasetBuilder(os.path.join(d, "a.bin"), dtype=dtype)
            builder.add_document([1, 2, 3, 4, 5], [2, 3])
            builder.add_document([], [])
            builder.add_document([7], [1])
            builder.finalize(os.path.join(d, "a.idx"))
            indexfile.write_index(os.path.join(d, "b.idx"), dtype,
                                  np.array([2, 3, 1], np.int32), np.array([0, 2, 2, 3], np.int64))
            with open(os.path.join(d, "a.idx"), "rb") as a, open(os.path.join(d, "b.idx"),
                                                                   "rb") as b:
                if a.read() != b.read():
                    return "megatron-core writes another .idx than indexfile"
    return None


# ------------------------------------------------------------------ the check, in a subprocess
class PendingCheck:
    """The check running in a subprocess, started as early as possible (it imports megatron-core
    and torch while the workers tokenize)."""

    def __init__(self, args, key: str):
        from .tokenizer import builder_args

        self.key = key
        flags = vars(builder_args(args))  # what the builder reads (legacy_tokenizer: False)
        env = dict(os.environ)
        # nothing to activate in this helper; MEGATRON_MUSA_PATCH=1 would import torch for nothing
        env.update({ACTIVATE_ENV: "0", AUTOACTIVATE_ENV: "0"})
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
            __file__))))
        env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
        # files, not pipes: nobody reads while the work runs, and a pipe that fills up (import
        # warnings) would block the check
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from megatron_musa_patch.data.light import _check_main; "
             "_check_main()"], stdin=subprocess.PIPE, stdout=self.out, stderr=self.err, env=env,
            text=True)
        self.proc.stdin.write(json.dumps(flags))
        self.proc.stdin.close()
        self.record: Optional[dict] = None

    def running(self) -> bool:
        return self.record is None and self.proc.poll() is None

    def result(self) -> dict:
        """The record (waits for the subprocess); a tokenizer that does not load raises the
        builder's DataError, as the exact path would have."""
        if self.record is None:
            self.proc.wait()
            self.out.seek(0)
            self.err.seek(0)
            out, err = self.out.read(), self.err.read()
            try:
                answer = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                tail = " ".join(err.split())[-800:]
                raise DataError("checking the tokenizer against megatron-core's builder failed "
                                f"(exit status {self.proc.returncode}): {tail}. Fix: check that "
                                "megatron-core and transformers import in this environment, or "
                                "pass --exact-tokenize.") from None
            if "error" in answer:
                raise DataError(answer["error"])
            self.record = answer["record"]
            save_record(self.key, self.record)
        return self.record

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.out, self.err):
            f.close()


def _check_main() -> None:
    """Subprocess entry: flags as JSON on stdin, one JSON answer line on stdout."""
    import argparse

    flags = json.load(sys.stdin)
    _without_torch_compile()
    try:
        record = check_in_process(argparse.Namespace(**flags))
        answer = {"record": record}
    except DataError as exc:
        answer = {"error": str(exc)}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    sys.stdout.flush()


def _without_torch_compile() -> None:
    """``import megatron.core`` decorates its fused functions with ``torch.compile``
    (``megatron.core.jit.jit_fuser``), which imports dynamo and inductor: a third of the check's
    time, for kernels this process never runs (it builds a tokenizer and
    writes two small indexes). Here the decorator leaves them as they are, as
    ``megatron.core.jit.disable_jit_fuser`` would, were it callable before that import."""
    import torch

    def eager(model=None, **_options):
        return model if model is not None else (lambda fn: fn)

    torch.compile = eager


def same_as_guess(spec: LightSpec, record: dict) -> bool:
    return bool(record.get("ok")) and spec == spec_from_record(spec.tokenizer_json, record)
