#!/usr/bin/env python
"""`mmp data prepare` vs Megatron-LM's tools/preprocess_data.py: same corpus, same tokenizer,
same worker count, one run.

Reports, for each tool: wall time, tokens/s end to end, tokens/s without interpreter start-up
(each tool's start-up is measured on a one-line corpus and subtracted), CPU seconds of the whole
process tree, peak memory of the process tree (sum of RSS, and sum of PSS which counts pages
shared by forked workers once); then the ratio, and whether the .bin/.idx files are identical.

Defaults are offline and reproducible: the corpus is Python's own standard-library source cut
into ~1.5 KB JSON-lines documents (repeated to reach --corpus-mb), and the tokenizer is a
byte-level BPE trained on it with `mmp data train-tokenizer`.

The small-corpus row (``--small``, also run first by default) is what a new user meets: the wall
clock of one command, start-up included, on a held-out corpus -- the standard library's own test
modules, one JSON line per module, about 17 MB -- with the quickstart's 4k byte-level BPE (trained
on its corpus of help topics and standard-library source). `mmp data prepare` runs twice per
round: with an empty tokenizer-check cache (the first use of a tokenizer: the check against
megatron-core's builder runs in a subprocess meanwhile) and with the cache that run filled.

    MEGATRON_LM_PATH=/path/to/Megatron-LM python benchmarks/bench_data_prepare.py \
        --workers 2 --corpus-mb 64 --repeat 2
    MEGATRON_LM_PATH=/path/to/Megatron-LM python benchmarks/bench_data_prepare.py --small \
        --workers 2 --repeat 3

    # memory on a large input, ours only (the upstream run would take long):
    python benchmarks/bench_data_prepare.py --only mmp --corpus-mb 1024
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
os.environ.setdefault("MEGATRON_MUSA_PATCH_AUTOACTIVATE", "0")

from megatron_musa_patch.data import reference  # noqa: E402

MMP = ("import sys; from megatron_musa_patch.cli.main import main; "
       "sys.exit(main(['data', 'prepare'] + sys.argv[1:]))")


# ------------------------------------------------------------------ machine and inputs
def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cpu": model, "logical_cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}
    try:
        import psutil

        info["physical_cores"] = psutil.cpu_count(logical=False)
        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    info["load_average_before"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    from importlib import metadata

    for dist in ("megatron-core", "transformers", "tokenizers", "numpy"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return info


def python_sources(root):
    """The text of every readable .py file under ``root``, in sorted order."""
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        try:
            with open(path, encoding="utf-8") as f:
                yield f.read()
        except (OSError, UnicodeDecodeError):
            continue


def stdlib_documents():
    """~1.5 KB documents cut at blank lines from the standard library's .py files."""
    for text in python_sources(os.path.dirname(os.__file__)):
        buf = ""
        for para in text.split("\n\n"):
            buf += para + "\n\n"
            if len(buf) > 1500:
                yield buf
                buf = ""
        if buf:
            yield buf


def make_corpus(path: str, megabytes: float) -> None:
    target = int(megabytes * 2**20)
    written = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        while written < target:  # repeat the standard library as often as needed
            for doc in stdlib_documents():
                line = json.dumps({"text": doc}) + "\n"
                f.write(line)
                written += len(line.encode())
                if written >= target:
                    break
    os.replace(path + ".tmp", path)


def train_tokenizer(corpus: str, out: str, vocab: int) -> None:
    sample = out + ".sample.jsonl"
    with open(corpus, encoding="utf-8") as fin, open(sample, "w", encoding="utf-8") as fout:
        for i, line in enumerate(fin):
            if i >= 10000:
                break
            fout.write(line)
    cmd = [sys.executable, "-c", "import sys; from megatron_musa_patch.cli.main import main; "
           "sys.exit(main(['data', 'train-tokenizer'] + sys.argv[1:]))",
           "--input", sample, "--output-dir", out, "--vocab-size", str(vocab), "--force"]
    subprocess.run(cmd, check=True, env=env())
    os.remove(sample)


def env(**extra) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = REPO + os.pathsep + e.get("PYTHONPATH", "")
    e["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"
    # one tokenizer thread per worker process in both tools: equal workers, equal cores
    e["TOKENIZERS_PARALLELISM"] = "false"
    e["RAYON_NUM_THREADS"] = "1"
    e.update(extra)
    return e


# ------------------------------------------------------------------ running and measuring
class TreeSampler(threading.Thread):
    """Peak of the summed RSS and PSS of a process and all its descendants."""

    def __init__(self, pid: int, interval: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak_rss = self.peak_pss = 0
        self.peak_processes = 0
        self.peak_main_rss = self.peak_child_rss = 0  # largest single processes
        self.stop = threading.Event()

    def run(self):
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            rss = pss = 0
            for p in procs:
                try:
                    full = p.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss += full.rss
                pss += getattr(full, "pss", full.rss)
                if p.pid == self.pid:
                    self.peak_main_rss = max(self.peak_main_rss, full.rss)
                else:
                    self.peak_child_rss = max(self.peak_child_rss, full.rss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_processes = max(self.peak_processes, len(procs))
            self.stop.wait(self.interval)


def measure(cmd, cwd, **extra_env) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env(**extra_env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - start
    sampler.stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd[:4])} ...")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": sampler.peak_rss / 2**20,
            "peak_pss_mib": sampler.peak_pss / 2**20, "processes": sampler.peak_processes,
            "peak_main_rss_mib": sampler.peak_main_rss / 2**20,
            "peak_worker_rss_mib": sampler.peak_child_rss / 2**20}


def commands(tool, corpus, prefix, args):
    tok = ["--tokenizer-type", args.tokenizer_type, "--tokenizer-model", args.tokenizer_model,
           "--workers", str(args.workers), "--log-interval", str(args.log_interval)]
    if args.append_eod:
        tok.append("--append-eod")
    common = ["--input", corpus, "--output-prefix", prefix] + tok
    if tool == "mmp":
        return [sys.executable, "-c", MMP] + common + ["--force"]
    return reference.command(common)


def count(prefix: str):
    from megatron_musa_patch.data.indexfile import read_index

    index = read_index(prefix + ".idx")
    return int(index.sequence_lengths.sum(dtype="int64")), len(index.document_indices) - 1


def same(a: str, b: str) -> bool:
    for ext in (".bin", ".idx"):
        if os.path.getsize(a + ext) != os.path.getsize(b + ext):
            return False
        with open(a + ext, "rb") as fa, open(b + ext, "rb") as fb:
            while True:
                x, y = fa.read(1 << 22), fb.read(1 << 22)
                if x != y:
                    return False
                if not x:
                    return True
    return True


# ------------------------------------------------------------------ the small-corpus row
def heldout_documents():
    """The standard library's test modules, one document each, in sorted order: text no
    quickstart tokenizer was trained on (its corpus leaves the tests out)."""
    import sysconfig

    for text in python_sources(os.path.join(sysconfig.get_paths()["stdlib"], "test")):
        if text.strip():
            yield text


def make_heldout_corpus(path: str, megabytes: float) -> None:
    target = int(megabytes * 1e6)
    written = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for doc in heldout_documents():
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            if written + len(line.encode()) > target:
                break
            f.write(line)
            written += len(line.encode())
    if written == 0:
        raise SystemExit("no standard-library test modules found for the held-out corpus")
    os.replace(path + ".tmp", path)


def quickstart_tokenizer(work: str) -> str:
    """The quickstart's tokenizer: 4096-token byte-level BPE on examples/quickstart's corpus."""
    out = os.path.join(work, "quickstart_bpe4096")
    if not os.path.exists(os.path.join(out, "tokenizer.json")):
        corpus = os.path.join(work, "quickstart_corpus")
        subprocess.run([sys.executable, os.path.join(REPO, "examples", "quickstart",
                                                     "make_corpus.py"), corpus],
                       check=True, env=env(), stdout=subprocess.DEVNULL)
        cmd = [sys.executable, "-c", "import sys; from megatron_musa_patch.cli.main import main; "
               "sys.exit(main(['data', 'train-tokenizer'] + sys.argv[1:]))",
               "--input", corpus, "--output-dir", out, "--vocab-size", "4096", "--force"]
        subprocess.run(cmd, check=True, env=env(), stderr=subprocess.DEVNULL)
    return out


def small_row(args, work: str, tools) -> dict:
    """Wall clock of whole commands on the held-out corpus: preprocess_data.py, then ours with
    an empty tokenizer-check cache (first use), then with the cache it filled; alternated."""
    corpus = os.path.join(work, f"heldout_{args.small_mb:g}MB.jsonl")
    if not os.path.exists(corpus):
        print(f"building the held-out corpus {corpus} ...", file=sys.stderr)
        make_heldout_corpus(corpus, args.small_mb)
    row = argparse.Namespace(**vars(args))
    row.tokenizer_type, row.tokenizer_model = "HuggingFaceTokenizer", quickstart_tokenizer(work)
    row.append_eod = True
    lines = sum(1 for _ in open(corpus, "rb"))
    print(f"\nsmall-corpus row: {corpus} ({os.path.getsize(corpus) / 1e6:.1f} MB, {lines} "
          f"documents); tokenizer {row.tokenizer_model} (4096-token byte-level BPE); "
          f"--workers {args.workers} --append-eod; wall clock of the whole command")
    kinds = (["megatron"] if "megatron" in tools else []) + (
        ["mmp first use", "mmp cached"] if "mmp" in tools else [])
    walls = {k: [] for k in kinds}
    cpus = {k: [] for k in kinds}  # CPU seconds of the process tree: less sensitive to others' load
    prefixes = {}
    tokens = None
    for r in range(args.repeat):
        cache = os.path.join(work, f"tokenizer-cache-{r}")  # empty: a first use
        shutil.rmtree(cache, ignore_errors=True)
        for kind in kinds:
            tool = "megatron" if kind == "megatron" else "mmp"
            prefix = os.path.join(work, f"small_{kind.replace(' ', '_')}")
            m = measure(commands(tool, corpus, prefix, row), work, MMP_CACHE_DIR=cache)
            walls[kind].append(m["wall_s"])
            cpus[kind].append(m["cpu_s"])
            prefixes[kind] = f"{prefix}_text_document"
            tokens, documents = count(prefixes[kind])
            print(f"  round {r + 1} {kind:14s}: {m['wall_s']:6.2f} s wall, {m['cpu_s']:6.1f} s "
                  f"CPU, {tokens} tokens; load average {os.getloadavg()[0]:.2f}", flush=True)
    result = {"corpus": corpus, "corpus_bytes": os.path.getsize(corpus), "documents": lines,
              "tokens": tokens, "wall_s": walls, "cpu_s": cpus}
    print("  summary (median of %d, best in brackets):" % args.repeat)
    for kind in kinds:
        print(f"    {kind:14s}: {statistics.median(walls[kind]):6.2f} s wall "
              f"[{min(walls[kind]):.2f}], {statistics.median(cpus[kind]):6.1f} s CPU")
    if "megatron" in walls and "mmp cached" in walls:
        for kind in ("mmp first use", "mmp cached"):
            ratio = statistics.median(walls["megatron"]) / statistics.median(walls[kind])
            result[f"ratio {kind}"] = ratio
            cpu = statistics.median(cpus["megatron"]) / statistics.median(cpus[kind])
            result[f"cpu ratio {kind}"] = cpu
            print(f"    ratio preprocess_data.py / {kind}: {ratio:.2f}x wall clock (goal: >= "
                  f"2.5x), {cpu:.2f}x CPU time")
        result["identical"] = all(same(prefixes[k], prefixes["megatron"])
                                  for k in kinds if k != "megatron")
        print(f"    outputs: {'IDENTICAL' if result['identical'] else 'DIFFERENT'}")
    return result


# ------------------------------------------------------------------ main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--corpus", help="a JSON-lines corpus (default: generated, see --corpus-mb)")
    p.add_argument("--corpus-mb", type=float, default=64)
    p.add_argument("--tokenizer-type", default="HuggingFaceTokenizer")
    p.add_argument("--tokenizer-model", help="default: a byte-level BPE trained on the corpus")
    p.add_argument("--vocab-size", type=int, default=32000, help="of the trained tokenizer")
    p.add_argument("--no-append-eod", dest="append_eod", action="store_false")
    p.add_argument("--log-interval", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=1, help="alternate the tools this many times")
    p.add_argument("--only", choices=["both", "mmp", "megatron"], default="both")
    p.add_argument("--workdir", help="keep inputs and outputs here (default: a temp dir)")
    p.add_argument("--small", action="store_true",
                   help="only the small-corpus row (wall clock on the held-out corpus)")
    p.add_argument("--no-small", action="store_true", help="leave the small-corpus row out")
    p.add_argument("--small-mb", type=float, default=17.5,
                   help="size of the held-out corpus of the small-corpus row (default 17.5)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    args = p.parse_args(argv)

    tools = ["megatron", "mmp"] if args.only == "both" else [args.only]
    if "megatron" in tools and reference.checkout() is None:
        raise SystemExit("MEGATRON_LM_PATH must name a Megatron-LM checkout (with "
                         "tools/preprocess_data.py) to compare against; or pass --only mmp")
    work = args.workdir or tempfile.mkdtemp(prefix="bench_data_prepare_")
    os.makedirs(work, exist_ok=True)
    info = machine()
    print(f"machine: {info['cpu']}, {info['logical_cores']} logical cores"
          f"{', %s physical' % info['physical_cores'] if 'physical_cores' in info else ''}"
          f"{', %s GiB' % info['memory_gib'] if 'memory_gib' in info else ''}; "
          f"load average before: {info['load_average_before']}")
    small = None if args.no_small else small_row(args, work, tools)
    if args.small:
        code = 0 if small is None or small.get("identical", True) else 1
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": info, "small": small}, f, indent=1, default=str)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
        return code
    # the rows below measure steady throughput: our tokenizer check is cached by the start-up
    # run, so it is not part of them (the small-corpus row shows its cost)
    os.environ["MMP_CACHE_DIR"] = os.path.join(work, "tokenizer-cache")
    corpus = args.corpus
    if corpus is None:
        corpus = os.path.join(work, f"stdlib_{args.corpus_mb:g}MB.jsonl")
        if not os.path.exists(corpus):
            print(f"building corpus {corpus} ...", file=sys.stderr)
            make_corpus(corpus, args.corpus_mb)
    if args.tokenizer_model is None:
        args.tokenizer_model = os.path.join(work, f"bpe{args.vocab_size}")
        if not os.path.exists(os.path.join(args.tokenizer_model, "tokenizer.json")):
            print("training the tokenizer ...", file=sys.stderr)
            train_tokenizer(corpus, args.tokenizer_model, args.vocab_size)
    tiny = os.path.join(work, "one_line.jsonl")
    with open(corpus, encoding="utf-8") as fin, open(tiny, "w", encoding="utf-8") as fout:
        fout.write(fin.readline())

    results = {"machine": info, "small": small, "corpus": corpus,
               "corpus_bytes": os.path.getsize(corpus),
               "workers": args.workers, "tokenizer_type": args.tokenizer_type,
               "tokenizer_model": args.tokenizer_model, "append_eod": args.append_eod,
               "runs": {t: [] for t in tools}, "startup_s": {}}
    print(f"\ncorpus: {corpus} ({results['corpus_bytes'] / 2**20:.1f} MiB); tokenizer "
          f"{args.tokenizer_type} {args.tokenizer_model}; workers {args.workers}; append-eod "
          f"{args.append_eod}")
    results["baseline"] = {}
    for tool in tools:  # start-up cost and memory with no data to speak of: a one-line corpus
        if tool == "mmp":  # first use of the tokenizer: fills the check cache for what follows
            m = measure(commands(tool, tiny, os.path.join(work, f"{tool}_tiny"), args), work)
            print(f"  one-line corpus mmp, first use of the tokenizer: {m['wall_s']:5.1f} s",
                  flush=True)
        m = measure(commands(tool, tiny, os.path.join(work, f"{tool}_tiny"), args), work)
        results["startup_s"][tool] = m["wall_s"]
        results["baseline"][tool] = m
        print(f"  one-line corpus {tool:8s}: {m['wall_s']:5.1f} s (start-up), peak "
              f"{m['peak_rss_mib']:.0f} MiB RSS / {m['peak_pss_mib']:.0f} MiB PSS; largest "
              f"processes: main {m['peak_main_rss_mib']:.0f} MiB, worker "
              f"{m['peak_worker_rss_mib']:.0f} MiB", flush=True)
    prefixes = {}
    for r in range(args.repeat):
        for tool in tools:
            prefix = os.path.join(work, f"{tool}_out")
            m = measure(commands(tool, corpus, prefix, args), work)
            prefixes[tool] = f"{prefix}_text_document"
            m["tokens"], m["documents"] = count(prefixes[tool])
            m["tokens_per_s"] = m["tokens"] / m["wall_s"]
            steady = m["wall_s"] - results["startup_s"][tool]
            m["tokens_per_s_after_startup"] = m["tokens"] / steady if steady > 0 else None
            results["runs"][tool].append(m)
            print(f"  run {r + 1} {tool:8s}: {m['wall_s']:7.1f} s wall, {m['cpu_s']:7.1f} s CPU, "
                  f"{m['tokens']} tokens, {m['tokens_per_s']:,.0f} tokens/s "
                  f"({m['tokens_per_s_after_startup'] or 0:,.0f} after start-up), peak "
                  f"{m['peak_rss_mib']:.0f} MiB RSS / {m['peak_pss_mib']:.0f} MiB PSS over "
                  f"{m['processes']} processes (largest: main {m['peak_main_rss_mib']:.0f} MiB, "
                  f"worker {m['peak_worker_rss_mib']:.0f} MiB)", flush=True)

    def best(tool, key):
        return max(x[key] for x in results["runs"][tool])

    print(f"\nsummary (best of {args.repeat}); load average now {os.getloadavg()}:")
    for tool in tools:
        runs = results["runs"][tool]
        print(f"  {tool:8s}: {best(tool, 'tokens_per_s'):,.0f} tokens/s end to end "
              f"(median {statistics.median(x['tokens_per_s'] for x in runs):,.0f}), "
              f"{best(tool, 'tokens_per_s_after_startup') or 0:,.0f} tokens/s after start-up "
              f"({results['startup_s'][tool]:.1f} s start-up), peak "
              f"{max(x['peak_rss_mib'] for x in runs):.0f} MiB RSS / "
              f"{max(x['peak_pss_mib'] for x in runs):.0f} MiB PSS")
    code = 0 if small is None or small.get("identical", True) else 1
    if len(tools) == 2:
        ratio = best("mmp", "tokens_per_s") / best("megatron", "tokens_per_s")
        ratio_steady = (best("mmp", "tokens_per_s_after_startup")
                        / best("megatron", "tokens_per_s_after_startup"))
        identical = same(prefixes["mmp"], prefixes["megatron"])
        results.update(ratio=ratio, ratio_after_startup=ratio_steady, identical=identical)
        print(f"  ratio mmp/megatron: {ratio:.2f}x end to end, {ratio_steady:.2f}x after "
              f"start-up, at {args.workers} workers (goal: >= 2x)")
        print(f"  outputs: {'IDENTICAL' if identical else 'DIFFERENT'} "
              f"(.bin and .idx of {prefixes['mmp']} vs {prefixes['megatron']})")
        code = code if identical else 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
