"""End-to-end step time of the stock pretrain_gpt.py on one GPU: upstream's local layer spec
alone against the same run through the layer, side by side in one go.

Runs (``--runs``, in this order by default; the csrc/ kernels build in the background during
upstream's two runs, and the layer's runs use them once loaded, torch ops otherwise):

* ``upstream``: plain torchrun, ``--transformer-impl local`` with the ``--no-*`` fusion flags the
  local path needs without Apex/TE (gradient accumulation, persistent norm, RoPE, masked softmax);
* ``upstream-full-recompute``: ``upstream`` plus ``--recompute-granularity full
  --recompute-method uniform --recompute-num-layers 1``;
* ``layer-off``: the same arguments through ``mmp run`` with ``MEGATRON_MUSA_PATCH_ONLY=none``
  (the required patches only): what the layer costs when its features are off;
* ``layer``: through the layer with upstream's fusion defaults (no ``--no-*`` flag) and
  ``--use-flash-attn``;
* ``layer-recompute``: ``layer`` plus ``--attn-recompute --mlp-recompute --recompute-variance``.

For each: Megatron's own ``elapsed time per iteration`` and ``throughput per GPU
(TFLOP/s/GPU)`` (``--log-throughput``), medians over the iterations after ``--skip``; peak
``torch.cuda.max_memory_allocated`` (printed at exit by ``e2e_entry.py``); the loss curve. Then
the ratios and the goals of issue 10, each PASS / FAIL / n/a. Logs and ``e2e.json`` go to
``--out``.

The model is issue 10's (``--size full``): 24 layers, hidden 2048, FFN 5632 (SwiGLU), 16 heads,
sequence 2048, micro-batch 2, global batch 16, bf16, mock data. ``--size tiny`` runs a toy model
for a dry run of this script; on the CPU (``--device cpu``) upstream cannot run at all, so the
two upstream runs are taken through the layer's required patches (labelled) there.

On a GPU machine without network: ``bash benchmarks/e2e_gpu_pack.sh`` here first, then
``bash benchmarks/e2e_gpu.sh`` there (it installs the packed wheels and calls this script).

Usage: python benchmarks/e2e_gpu.py [--lm .e2e/Megatron-LM] [--size full|tiny] [--iters 15]
       [--skip 9] [--runs upstream,upstream-full-recompute,layer-off,layer,layer-recompute]
       [--out DIR] [--budget-s 450] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.machine import describe  # noqa: E402

ENTRY = ROOT / "benchmarks" / "e2e_entry.py"
MMP = ("import sys; sys.path.insert(0, %r); import _megatron_musa_patch_boot as boot; boot.cli()"
       % str(ROOT))

SIZES = {
    "full": ["--num-layers", "24", "--hidden-size", "2048", "--ffn-hidden-size", "5632",
             "--num-attention-heads", "16", "--seq-length", "2048",
             "--max-position-embeddings", "2048", "--micro-batch-size", "2",
             "--global-batch-size", "16", "--vocab-size", "32000"],
    "tiny": ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "176",
             "--num-attention-heads", "4", "--seq-length", "128",
             "--max-position-embeddings", "128", "--micro-batch-size", "2",
             "--global-batch-size", "4", "--vocab-size", "1000"],
}
COMMON = ["--transformer-impl", "local", "--swiglu", "--normalization", "RMSNorm",
          "--position-embedding-type", "rope", "--disable-bias-linear", "--bf16",
          "--mock-data", "--tokenizer-type", "NullTokenizer", "--lr", "3e-4", "--min-lr", "3e-5",
          "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--weight-decay", "0.1",
          "--clip-grad", "1.0", "--hidden-dropout", "0", "--attention-dropout", "0",
          "--seed", "1234", "--log-interval", "1", "--log-throughput", "--eval-iters", "0",
          "--eval-interval", "100000", "--distributed-backend", "nccl"]
# what upstream's local spec needs without Apex / TransformerEngine / Megatron's fused kernels
NO_FUSION = ["--no-gradient-accumulation-fusion", "--no-persist-layer-norm", "--no-rope-fusion",
             "--no-masked-softmax-fusion"]
FULL_RECOMPUTE = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]
FINE_RECOMPUTE = ["--attn-recompute", "--mlp-recompute", "--recompute-variance"]

# upstream's runs first: the csrc/ kernels build beside them, for the layer's runs
RUNS = {  # name -> (route, extra flags, extra environment)
    "upstream": ("torchrun", NO_FUSION, {}),
    "upstream-full-recompute": ("torchrun", NO_FUSION + FULL_RECOMPUTE, {}),
    "layer-off": ("mmp", NO_FUSION, {"MEGATRON_MUSA_PATCH_ONLY": "none"}),
    "layer": ("mmp", ["--use-flash-attn"], {}),
    "layer-recompute": ("mmp", ["--use-flash-attn", *FINE_RECOMPUTE], {}),
}

LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.Ee+-]+)")
ELAPSED = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)")
TFLOPS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+)")
PEAK = re.compile(r"E2E peak memory allocated \(GiB\): ([0-9.]+)")


def command(route, lm, args, nproc):
    launcher = ["--standalone", f"--nproc-per-node={nproc}"]
    script = [str(ENTRY), str(Path(lm) / "pretrain_gpt.py"), *args]
    if route == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *launcher, *script]
    return [sys.executable, "-c", MMP, "run", *launcher, *script]


def run_environment(lm, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    path = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(MEGATRON_LM_PATH=str(lm), PYTHONPATH=os.pathsep.join(path),
               CUDA_DEVICE_MAX_CONNECTIONS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def parse(log, skip):
    def per_iteration(pattern):
        return {int(i): float(v) for i, v in pattern.findall(log)}

    losses, elapsed, tflops = per_iteration(LOSS), per_iteration(ELAPSED), per_iteration(TFLOPS)
    window = [i for i in sorted(elapsed) if i > skip]
    peak = PEAK.findall(log)
    return {
        "losses": losses,
        "ms_per_iteration": statistics.median(elapsed[i] for i in window) if window else None,
        "tflops": statistics.median(tflops[i] for i in window if i in tflops)
        if any(i in tflops for i in window) else None,
        "peak_gib": float(peak[-1]) if peak else None,
        "iterations_timed": window,
    }


def run_one(name, opts, deadline, layer_env=None):
    route, flags, env_extra = RUNS[name]
    if route == "mmp":
        env_extra = {**env_extra, **(layer_env or {})}
    note = ""
    if opts.device == "cpu" and route == "torchrun":  # upstream cannot run on the CPU
        route, env_extra = "mmp", {**env_extra, "MEGATRON_MUSA_PATCH_ONLY": "none"}
        note = "CPU dry run: the layer's required patches stand in for upstream"
    args = SIZES[opts.size] + COMMON + ["--train-iters", str(opts.iters)] + flags
    cmd = command(route, opts.lm, args, opts.nproc)
    timeout = max(1, min(opts.run_timeout, deadline - time.monotonic()))
    log_path = Path(opts.out) / f"e2e_{name}.log"
    start = time.monotonic()
    with open(log_path, "w") as log_file:
        log_file.write(" ".join(cmd) + "\n\n")
        log_file.flush()
        proc = subprocess.Popen(cmd, env=run_environment(opts.lm, env_extra), cwd=opts.out,
                                stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = f"killed after {timeout:.0f} s"
    wall = time.monotonic() - start
    result = parse(log_path.read_text(errors="replace"), opts.skip)
    result.update(name=name, route=route, flags=flags, env=env_extra, rc=rc, wall_s=round(wall, 1),
                  note=note, log=str(log_path))
    status = "ok" if rc == 0 else f"FAILED (rc {rc}); see {log_path}"
    print(f"  {name:<24} {wall:6.0f} s  {status}", flush=True)
    return result


def ratio(a, b):
    return a / b if a and b else None


def goals(results):
    """Issue 10's goals, each (text, value, PASS / FAIL / n/a)."""
    r = {x["name"]: x for x in results if x["rc"] == 0}

    def get(name, key):
        return r.get(name, {}).get(key)

    def check(text, value, ok):
        return (text, value, "n/a" if value is None else ("PASS" if ok(value) else "FAIL"))

    loss_gap = None
    if "upstream" in r and "layer" in r:
        common = sorted(set(r["upstream"]["losses"]) & set(r["layer"]["losses"]))
        if common:
            loss_gap = max(abs(r["layer"]["losses"][i] - r["upstream"]["losses"][i])
                           / abs(r["upstream"]["losses"][i]) for i in common)
    return [
        check("layer / upstream throughput >= 2.0",
              ratio(get("upstream", "ms_per_iteration"), get("layer", "ms_per_iteration")),
              lambda v: v >= 2.0),
        check("layer peak memory / upstream's <= 1.0",
              ratio(get("layer", "peak_gib"), get("upstream", "peak_gib")), lambda v: v <= 1.0),
        check("layer vs upstream loss, max relative gap per iteration <= 1% (bf16)", loss_gap,
              lambda v: v <= 0.01),
        check("layer-recompute peak / full recompute's <= 1.0",
              ratio(get("layer-recompute", "peak_gib"), get("upstream-full-recompute", "peak_gib")),
              lambda v: v <= 1.0),
        check("layer-recompute / full recompute throughput >= 1.6",
              ratio(get("upstream-full-recompute", "ms_per_iteration"),
                    get("layer-recompute", "ms_per_iteration")), lambda v: v >= 1.6),
        check("layer-off / upstream iteration time <= 1.01",
              ratio(get("layer-off", "ms_per_iteration"), get("upstream", "ms_per_iteration")),
              lambda v: v <= 1.01),
    ]


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def report(results, opts):
    print(f"\nstock pretrain_gpt.py, {opts.size} model, {opts.nproc} device(s), medians over "
          f"iterations {opts.skip + 1}-{opts.iters}:")
    print(f"  {'run':<24}{'ms/iter':>10}{'TFLOP/s':>10}{'peak GiB':>10}{'last loss':>11}")
    base = next((x for x in results if x["name"] == "upstream" and x["rc"] == 0), None)
    for x in results:
        last = x["losses"][max(x["losses"])] if x["losses"] else None
        speed = ratio(base and base["ms_per_iteration"], x["ms_per_iteration"])
        print(f"  {x['name']:<24}{fmt(x['ms_per_iteration'], '10.1f')}{fmt(x['tflops'], '10.4g')}"
              f"{fmt(x['peak_gib'], '10.2f')}{fmt(last, '11.4f')}"
              f"{'' if speed is None else f'   {speed:.2f}x upstream'}"
              f"{'   (' + x['note'] + ')' if x['note'] else ''}")
    print("\ngoals (issue 10):")
    table = goals(results)
    for text, value, verdict in table:
        print(f"  {verdict:<5} {text}: {fmt(value, '.3f')}")
    return table


def prebuild_kernels(opts):
    """Starts the csrc/ build (first use; minutes with nvcc) beside the upstream runs, which do
    not need it, so the layer's runs find it cached."""
    code = ("import sys; sys.path.insert(0, %r); from megatron_musa_patch.lib.ops import kernels; "
            "kernels.available('rms_norm_fwd', %r); print(kernels.status(%r), flush=True)"
            % (str(ROOT), opts.device, opts.device))
    env = dict(os.environ, MEGATRON_MUSA_PATCH_AUTOACTIVATE="0",
               MAX_JOBS=os.environ.get("MAX_JOBS", "8"))
    log = open(Path(opts.out) / "e2e_kernels_build.log", "w")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log,
                            stderr=subprocess.STDOUT), log


def finish_kernel_build(build, opts, deadline):
    """Waits for the background build (until ``deadline``). Loaded: the layer's runs use the
    cached kernels. Otherwise they run with MEGATRON_MUSA_PATCH_KERNELS=0 (torch ops) rather
    than each retrying the build inside a timed run."""
    proc, log = build
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    text = (Path(opts.out) / "e2e_kernels_build.log").read_text().strip()
    status = text.splitlines()[-1] if text else f"no output (exit {proc.returncode})"
    loaded = ": loaded" in status
    print(f"  csrc kernels: {status}" + ("" if loaded else
                                        " -> the layer's runs use torch ops "
                                        "(MEGATRON_MUSA_PATCH_KERNELS=0)"))
    return {} if loaded else {"MEGATRON_MUSA_PATCH_KERNELS": "0"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default=os.environ.get("MEGATRON_LM_PATH")
                        or str(ROOT / ".e2e" / "Megatron-LM"))
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--skip", type=int, default=9, help="untimed warm-up iterations")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--out", default=os.environ.get("OUT") or "e2e-out")
    parser.add_argument("--budget-s", type=float, default=450,
                        help="start no run after this many seconds")
    parser.add_argument("--run-timeout", type=float, default=170)
    parser.add_argument("--no-prebuild", action="store_true",
                        help="do not build csrc/ in the background (the layer then builds it "
                             "in its first run, or uses torch)")
    opts = parser.parse_args()
    import torch

    opts.device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    names = [n.strip() for n in opts.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        parser.error(f"--runs: unknown {', '.join(unknown)}; known: {', '.join(RUNS)}")
    if not (Path(opts.lm) / "pretrain_gpt.py").is_file():
        parser.error(f"--lm {opts.lm}: no pretrain_gpt.py there. Run "
                     f"benchmarks/e2e_gpu_pack.sh, or point --lm / MEGATRON_LM_PATH at a "
                     f"Megatron-LM checkout of tag core_v0.16.1")
    opts.out = str(Path(opts.out).resolve())
    opts.lm = str(Path(opts.lm).resolve())  # the runs start in --out
    os.makedirs(opts.out, exist_ok=True)
    print(describe())
    if opts.device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA "
              f"{torch.version.cuda}")
    start = time.monotonic()
    deadline = start + opts.budget_s
    build = None
    if opts.device != "cpu" and not opts.no_prebuild:
        build = prebuild_kernels(opts)
    results, skipped = [], []
    print(f"runs ({opts.size} model, {opts.iters} iterations each; logs in {opts.out}):")
    layer_env = {}
    for name in names:
        if RUNS[name][0] == "mmp" and build is not None:
            layer_env = finish_kernel_build(build, opts, deadline)
            build = None
        if time.monotonic() > deadline:
            skipped.append(name)
            continue
        results.append(run_one(name, opts, deadline, layer_env))
    if build is not None:
        finish_kernel_build(build, opts, time.monotonic())
    if skipped:
        print(f"  not run (past --budget-s {opts.budget_s:.0f}): {', '.join(skipped)}")
    table = report(results, opts)
    with open(Path(opts.out) / "e2e.json", "w") as f:
        json.dump({"machine": describe(), "size": opts.size, "iters": opts.iters,
                   "skip": opts.skip, "results": results, "skipped": skipped,
                   "goals": [{"goal": t, "value": v, "verdict": s} for t, v, s in table]},
                  f, indent=1)
    print(f"total {time.monotonic() - start:.0f} s")
    return 0 if all(x["rc"] == 0 for x in results) and not skipped else 1


if __name__ == "__main__":
    sys.exit(main())
