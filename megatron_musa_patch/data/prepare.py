"""``mmp data prepare``: tokenize and binarize, a drop-in for Megatron-LM's preprocess_data.py.

Same flags, same tokenizer (megatron-core's builder), same ``.bin/.idx`` bytes. What differs is
how the work is spread: every input file is cut into byte-range chunks that the workers read,
parse and tokenize themselves (batched into the tokenizer library), handing back token arrays;
the main process appends them in order with megatron-core's IndexedDatasetBuilder. Many input
files share one pool of workers and at most ``2 x workers`` chunks are in flight, so memory is
set by the worker count and the chunk size, not by the size of the corpus.

Output names:

* ``--output-prefix P`` with one input: ``P_<key>_document.bin/.idx`` (Megatron's naming);
* ``--output-dir D``: ``D/<input file name>_document.bin/.idx`` per input file (with several
  ``--json-keys``: ``D/<input file name>_<key>_document``).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from . import encode, inputs, light, manifest, tokenizer
from .bytelevel import FastPathMismatch
from .errors import DataError, line_number, where
from .progress import Progress
from .writer import PairWriter

LEVEL = "document"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tokenizer.add_arguments(parser)
    g = parser.add_argument_group("input data")
    g.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="files, quoted globs or directories of .jsonl / .json / .txt")
    g.add_argument("--json-keys", nargs="+", default=["text"],
                   help="keys to extract from each JSON object (default: text)")
    g.add_argument("--txt-whole-file", action="store_true",
                   help=".txt inputs: the whole file is one document (default: one per line)")
    g.add_argument("--split-sentences", action="store_true", help="not supported (NLTK)")
    g.add_argument("--keep-newlines", action="store_true",
                   help="accepted; only matters with --split-sentences")
    g.add_argument("--lang", default="english", help="accepted; only for --split-sentences")
    g = parser.add_argument_group("tokenization process")
    g.add_argument("--append-eod", action="store_true",
                   help="append the tokenizer's eod token to every non-empty document")
    g = parser.add_argument_group("output data")
    g.add_argument("--output-prefix", default=None,
                   help="one input: write <prefix>_<key>_document.bin/.idx (Megatron's naming)")
    g.add_argument("--output-dir", default=None,
                   help="write <dir>/<input file name>_document.bin/.idx per input file")
    g = parser.add_argument_group("runtime")
    g.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: all cores)")
    g.add_argument("--partitions", type=int, default=1,
                   help="accepted for compatibility; only 1 (chunks already split the work)")
    g.add_argument("--keep-sequential-samples", action="store_true",
                   help="accepted; document order is always kept")
    g.add_argument("--log-interval", type=int, default=1000,
                   help="without a terminal: print progress every this many documents")
    g.add_argument("--chunk-size", type=int, default=0, metavar="BYTES",
                   help="bytes of input per task (default: automatic, at most 1 MiB)")
    g.add_argument("--skip-bad-lines", action="store_true",
                   help="skip malformed lines, lines missing a key, empty files; count and "
                        "report them (default: stop at the first with its file and line)")
    g.add_argument("--force", action="store_true",
                   help="rebuild pairs even when their manifest says they are up to date")
    g.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    g.add_argument("--exact-tokenize", action="store_true",
                   help="call the tokenizer text by text, as preprocess_data.py does (slower; "
                        "same output, for checking)")


@dataclass
class FilePlan:
    file: inputs.InputFile
    prefixes: List[str]          # one output prefix per key
    chunks: List[tuple] = field(default_factory=list)
    documents: int = 0
    tokens: int = 0
    bad_count: int = 0
    bad: List[str] = field(default_factory=list)
    blank: int = 0
    record: dict = field(default_factory=dict)  # what the manifest records


@dataclass
class Summary:
    written: List[FilePlan] = field(default_factory=list)
    skipped_done: List[FilePlan] = field(default_factory=list)
    skipped_empty: List[str] = field(default_factory=list)
    documents: int = 0
    tokens: int = 0
    seconds: float = 0.0
    encoder_path: str = ""
    #: how the tokenizer was loaded: "builder" (megatron-core's), "light-checked" (tokenizer.json
    #: alone, a cached check), "light-checking" (tokenizer.json alone, checked during the run)
    tokenizer_source: str = ""
    redone: bool = False  # the check disagreed with the values the run started on


@dataclass
class Chosen:
    """The tokenizer of a run: its values, the encoder the workers inherit, what a spawned worker
    builds from, and the check still running (``light``), if any."""
    eod: Optional[int]
    vocab_size: Optional[int]
    encoder: object
    worker_source: object  # light.LightSpec, or the flags for megatron-core's builder
    source: str            # see Summary.tokenizer_source
    pending: Optional[light.PendingCheck] = None
    spec: Optional[light.LightSpec] = None

    def confirm(self, progress: Optional[Progress] = None) -> None:
        """Before anything is committed: the check must agree with what the run used."""
        if self.pending is None:
            return
        if progress is not None and self.pending.running():
            progress.line("prepare: waiting for the check of the tokenizer against "
                          "megatron-core's builder (once per tokenizer; cached afterwards)")
        record = self.pending.result()
        self.pending = None
        if not light.same_as_guess(self.spec, record):
            raise Redo(record)

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None


class Redo(Exception):
    """The check's answer differs from the values the run started on: start again with it."""

    def __init__(self, record: dict):
        super().__init__("the tokenizer check disagreed")
        self.record = record


def choose_tokenizer(args, fingerprint: dict, record: Optional[dict] = None) -> Chosen:
    """``light`` when tokenizer.json can stand in for megatron-core's builder (a cached check
    says so, or the check starts now in a subprocess), else megatron-core's builder."""
    tokenizer.check_arguments(args)
    path = None if args.exact_tokenize else light.tokenizer_json(args)
    if path is not None:
        key = light.record_key(fingerprint)
        record = record or light.load_record(key)
        if record is None and _megatron_core_loaded():
            # its import is already paid for in this process (a script, the tests): check now
            record = light.check_in_process(args)
            light.save_record(key, record)
        if record is not None and record.get("ok"):
            spec = light.spec_from_record(path, record)
            try:
                return Chosen(spec.eod, spec.vocab_size, light.LightEncoder(spec), spec,
                              "light-checked")
            except DataError:
                pass  # not the backend that was checked: megatron-core's builder decides
        if record is None:
            spec = light.guess(path, args)
            if spec is not None:
                pending = light.PendingCheck(args, key)  # first: it takes the longest
                try:
                    encoder = light.LightEncoder(spec)
                except BaseException:
                    pending.cancel()
                    raise
                return Chosen(spec.eod, spec.vocab_size, encoder, spec, "light-checking",
                              pending, spec)
    tok = tokenizer.build(args)
    return Chosen(tok.eod, tok.vocab_size,
                  tokenizer.TextEncoder(tok, allow_fast=not args.exact_tokenize), args, "builder")


def _megatron_core_loaded() -> bool:
    return "megatron.core" in sys.modules


SOURCE_NOTE = {
    "builder": "megatron-core's builder",
    "light-checked": "tokenizer.json alone, checked against megatron-core's builder",
    "light-checking": "tokenizer.json alone; checking it against megatron-core's builder "
                      "meanwhile (first use)",
}


def run(args: argparse.Namespace, stream=None) -> Summary:
    stream = stream or sys.stderr
    _check_flags(args)
    fingerprint = tokenizer.fingerprint(args)
    chosen = choose_tokenizer(args, fingerprint)
    try:
        try:
            try:
                return _run(args, stream, chosen, fingerprint)
            except DataError:
                # a problem met with guessed values may be the guess's: the check decides
                chosen.confirm()
                raise
        except Redo as redo:
            chosen.cancel()
            if not args.no_progress:
                why = redo.record.get("why") or "other eod, vocabulary or configuration"
                print(f"prepare: megatron-core's builder disagrees with the values read from "
                      f"tokenizer_config.json ({why}); nothing was kept, redoing the run with "
                      "its answer", file=stream, flush=True)
            chosen = choose_tokenizer(args, fingerprint, record=redo.record)
            summary = _run(args, stream, chosen, fingerprint)
            summary.redone = True
            return summary
    finally:
        chosen.cancel()


def _run(args, stream, chosen: Chosen, fingerprint: dict) -> Summary:
    files = inputs.expand(args.input, txt_whole_file=args.txt_whole_file)
    summary = Summary()
    plans = []
    for f, prefixes in zip(files, _output_prefixes(args, files)):
        if f.size == 0:
            if not args.skip_bad_lines:
                raise DataError(f"{f.path}: the file is empty. Fix: remove it from --input, or "
                                "pass --skip-bad-lines to skip empty files.")
            summary.skipped_empty.append(f.path)
            continue
        plans.append(FilePlan(f, prefixes))

    if args.append_eod and chosen.eod is None:
        raise DataError(f"--append-eod: the tokenizer ({args.tokenizer_type} "
                        f"{args.tokenizer_model or ''}) has no end-of-document token. Fix: give "
                        "it an eos token (e.g. eos_token in tokenizer_config.json) or drop "
                        "--append-eod.")
    dtype = tokenizer.output_dtype(chosen.vocab_size)
    settings = encode.Settings(tuple(args.json_keys), bool(args.append_eod),
                               bool(args.skip_bad_lines), np.dtype(dtype).name, chosen.eod,
                               chosen.vocab_size, allow_fast=not args.exact_tokenize)
    if chosen.eod is not None and args.append_eod:
        info = np.iinfo(dtype)
        if not info.min <= chosen.eod <= info.max:
            raise DataError(f"--append-eod: the eod id {chosen.eod} does not fit the "
                            f"{dtype.__name__} index chosen for vocab_size {chosen.vocab_size}. "
                            "Fix: use a tokenizer whose vocab_size covers its eod id.")
    common = {"tokenizer": fingerprint, "json_keys": list(args.json_keys),
              "append_eod": bool(args.append_eod), "skip_bad_lines": bool(args.skip_bad_lines),
              "dtype": settings.dtype, "level": LEVEL}

    todo = []
    for plan in plans:
        stamp = manifest.input_stamp(plan.file.path)
        digest = manifest.settings_hash(dict(common, kind=plan.file.kind))
        plan.record = {"input": stamp, "settings_hash": digest,
                       "settings": dict(common, kind=plan.file.kind)}
        if not args.force and all(manifest.is_done(p, stamp, digest) for p in plan.prefixes):
            summary.skipped_done.append(plan)
        else:
            todo.append(plan)

    encode.prime(settings, chosen.encoder)
    summary.encoder_path = chosen.encoder.path
    summary.tokenizer_source = chosen.source
    if not args.no_progress:
        print(f"prepare: {len(files)} input file(s), {len(todo)} to do"
              f"{f', {len(summary.skipped_done)} already done' if summary.skipped_done else ''}"
              f"; tokenizer {args.tokenizer_type} ({summary.encoder_path}; "
              f"{SOURCE_NOTE[chosen.source]}), {settings.dtype} ids, {args.workers} workers",
              file=stream, flush=True)
    start = time.monotonic()
    if todo:
        _process(args, todo, settings, dtype, summary, stream, chosen)
    summary.seconds = time.monotonic() - start
    summary.written = [p for p in todo if p.documents]  # (empty ones are in skipped_empty)
    summary.documents = sum(p.documents for p in summary.written)
    summary.tokens = sum(p.tokens for p in summary.written)
    if not args.no_progress:
        _report(summary, stream)
    return summary


def _check_flags(args) -> None:
    if args.split_sentences:
        raise DataError("--split-sentences: sentence splitting (NLTK punkt) is not supported by "
                        "`mmp data prepare`. Fix: split beforehand and store each document as a "
                        "JSON list of sentences (each becomes one sequence), or use Megatron-LM's "
                        "tools/preprocess_data.py for this step.")
    if args.partitions != 1:
        raise DataError(f"--partitions {args.partitions}: `mmp data prepare` already splits every "
                        "file into chunks for its workers, and Megatron's partitions reorder "
                        "documents. Fix: drop --partitions (or pass 1) and set --workers.")
    if args.workers < 1:
        raise DataError(f"--workers {args.workers}: needs at least 1.")
    if bool(args.output_prefix) == bool(args.output_dir):
        raise DataError("give exactly one of --output-prefix (one input, Megatron's naming) and "
                        "--output-dir (any number of inputs).")
    for key in args.json_keys:
        if not key or any(c.isspace() for c in key) or os.sep in key:
            raise DataError(f"--json-keys {key!r}: a key must be non-empty, without spaces or "
                            f"'{os.sep}' (it becomes part of the output file name).")
    if args.chunk_size < 0:
        raise DataError("--chunk-size must be positive (bytes).")


def _output_prefixes(args, files: List[inputs.InputFile]) -> List[List[str]]:
    keys = list(args.json_keys)
    for f in files:
        if f.kind.startswith("txt") and len(keys) > 1:
            raise DataError(f"{f.path}: a .txt input has no keys, so it cannot be split by "
                            f"--json-keys {' '.join(keys)}. Fix: pass one key (it names the "
                            "output), or convert the file to JSON lines.")
    if args.output_prefix:
        if len(files) != 1:
            raise DataError(f"--output-prefix names one output but --input gives {len(files)} "
                            "files. Fix: use --output-dir DIR to get one pair per input file "
                            "(DIR/<file name>_document.bin/.idx).")
        return [[f"{args.output_prefix}_{key}_{LEVEL}" for key in keys]]
    out = os.path.abspath(args.output_dir)
    names: Dict[str, str] = {}
    result = []
    for f in files:
        if f.name in names:
            raise DataError(f"{f.path} and {names[f.name]} would both write "
                            f"{os.path.join(out, f.name)}_{LEVEL}.bin. Fix: give the files "
                            "distinct names, or prepare them into separate --output-dir.")
        names[f.name] = f.path
        base = os.path.join(out, f.name)
        result.append([f"{base}_{LEVEL}"] if len(keys) == 1
                      else [f"{base}_{key}_{LEVEL}" for key in keys])
    return result


def _context():
    methods = multiprocessing.get_all_start_methods()
    # fork: workers inherit the tokenizer the main process already loaded
    return multiprocessing.get_context("fork" if "fork" in methods else None)


#: input bytes per worker below which a first use's tokenizer check outlasts the work (the
#: check's cost against a worker's rate: docs/benchmarks.md, data preparation)
CHECK_OUTLASTS_WORK = 16 << 20
#: how far such a job's workers step back for the check
YIELD_TO_CHECK = 10


def _worker_niceness(chosen: Chosen, total_bytes: int, workers: int) -> int:
    """On a small job the tokenizer check (first use) is what the command waits for, and it
    runs on one core: the workers, done sooner anyway, yield the CPU to it. A larger job keeps
    its workers at full priority (the work is the long part; the niceness would stay)."""
    if chosen.pending is None or total_bytes >= CHECK_OUTLASTS_WORK * max(1, workers):
        return 0
    return YIELD_TO_CHECK


def _process(args, todo: List[FilePlan], settings, dtype, summary: Summary, stream,
             chosen: Chosen) -> None:
    total = sum(p.file.size for p in todo)
    size = inputs.chunk_size_for(total, args.workers, args.chunk_size)
    tasks = []
    for fi, plan in enumerate(todo):
        plan.chunks = inputs.chunks(plan.file, size, inputs.FIRST_CHUNK if fi == 0 else 0)
        tasks.extend(encode.Task(fi, ci, plan.file.path, plan.file.kind, s, e)
                     for ci, (s, e) in enumerate(plan.chunks))
    window = 2 * args.workers
    pending: collections.deque = collections.deque()
    writers: Optional[List[PairWriter]] = None
    progress = None
    executor = cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=_context(),
                                      initializer=encode.init_worker,
                                      initargs=(settings, chosen.worker_source,
                                                _worker_niceness(chosen, total, args.workers)))
    next_task = 0
    try:
        while next_task < len(tasks) and len(pending) < window:
            pending.append((tasks[next_task], executor.submit(encode.process_chunk,
                                                              tasks[next_task])))
            next_task += 1
        # after the workers exist: tqdm starts a thread, which must not be forked
        progress = Progress(total, args.log_interval, stream, disable=args.no_progress)
        while pending:
            task, future = pending.popleft()
            result = _result(future, task)
            if next_task < len(tasks):
                pending.append((tasks[next_task], executor.submit(encode.process_chunk,
                                                                  tasks[next_task])))
                next_task += 1
            plan = todo[task.file_index]
            if result.fatal is not None:
                index, reason, fix = result.fatal
                raise DataError(f"{_location(task, result, index)}: {reason}."
                                + (f" Fix: {fix}." if fix else ""))
            if writers is None:
                writers = [PairWriter(p, dtype) for p in plan.prefixes]
            for writer, packed in zip(writers, result.keys):
                writer.add(packed)
            plan.documents += result.documents
            plan.tokens += result.tokens
            plan.blank += result.blank
            plan.bad_count += result.bad_count
            for index, reason in result.bad:
                if len(plan.bad) < encode.MAX_BAD_EXAMPLES:
                    plan.bad.append(f"{_location(task, result, index)}: {reason}")
            progress.update(result.nbytes, result.documents, result.tokens)
            if task.chunk_index == len(plan.chunks) - 1:
                chosen.confirm(progress)  # nothing is committed before the check agrees
                _finish(plan, writers, args, summary, progress)
                writers = None
    except BaseException:
        for _, future in pending:
            future.cancel()
        if writers:
            for w in writers:
                w.abort()
        executor.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        if progress is not None:
            progress.close()
    executor.shutdown(wait=True)


def _result(future, task) -> encode.ChunkResult:
    try:
        return future.result()
    except cf.process.BrokenProcessPool:
        raise DataError(f"a worker process died while reading {task.path} (killed, or out of "
                        "memory?). Finished pairs are kept. Fix: rerun (finished files are "
                        "skipped); lower --workers or --chunk-size if memory is short.") from None
    except FastPathMismatch as exc:
        raise DataError(f"{task.path}: internal error: {exc}. Nothing was written for this file. "
                        "Fix: rerun with --exact-tokenize (tokenizes text by text, as "
                        "preprocess_data.py does) and please report this.") from None
    except OSError as exc:
        raise DataError(f"{task.path}: cannot read it ({exc.strerror or exc}). Fix: check the "
                        "file and rerun (finished files are skipped).") from None


def _location(task, result: encode.ChunkResult, index: int) -> str:
    if result.unit == "element":
        return where(task.path, element=index)
    return where(task.path, line_number(task.path, result.first_offset) + index)


def _finish(plan: FilePlan, writers: List[PairWriter], args, summary: Summary,
            progress: Progress) -> None:
    if plan.documents == 0:
        for w in writers:
            w.abort()
        what = (f"{plan.bad_count} bad line(s) skipped" if plan.bad_count
                else "only blank lines")
        if not args.skip_bad_lines:
            raise DataError(f"{plan.file.path}: no documents in the file ({what}). Fix: remove it "
                            "from --input, or pass --skip-bad-lines to skip such files.")
        summary.skipped_empty.append(plan.file.path)
        return
    record = dict(plan.record, skipped_lines=plan.bad_count, blank_lines=plan.blank)
    for w in writers:
        w.commit(record)
    if plan.bad_count:
        progress.line(f"prepare: {plan.file.path}: skipped {plan.bad_count} bad line(s)")


def _report(summary: Summary, stream) -> None:
    rate = summary.tokens / summary.seconds if summary.seconds > 0 else 0.0
    print(f"prepare: wrote {len(summary.written)} file(s), {summary.documents} documents, "
          f"{summary.tokens} tokens in {summary.seconds:.1f}s ({rate:,.0f} tokens/s)",
          file=stream)
    for plan in summary.written:
        for prefix in plan.prefixes:
            print(f"  {prefix}  ({plan.documents} documents)", file=stream)
        if plan.bad_count:
            print(f"  skipped {plan.bad_count} bad line(s) in {plan.file.path}; first ones:",
                  file=stream)
            for line in plan.bad[:5]:
                print(f"    {line}", file=stream)
    for plan in summary.skipped_done:
        print(f"  up to date, skipped: {', '.join(plan.prefixes)}", file=stream)
    for path in summary.skipped_empty:
        print(f"  skipped (no documents): {path}", file=stream)


def main(args: argparse.Namespace) -> int:
    try:
        run(args)
    except KeyboardInterrupt:
        print("mmp data prepare: interrupted; finished pairs are kept and a rerun skips them",
              file=sys.stderr)
        return 130
    return 0
