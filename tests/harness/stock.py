"""Runs the stock Megatron-LM ``pretrain_gpt.py`` on CPU ranks through one activation route and
returns the per-iteration losses from its log. Shared by the stock tests and the benchmarks."""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.Ee+-]+)")
TIME = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)")

# A tiny GPT that any laptop trains in seconds. Dropout off and CPU initialisation, so layouts
# start from the same weights and can be compared with the 1-rank run. The --no-*-fusion flags
# keep upstream's unfused code as the reference (and avoid torch.compile's first-step cost);
# tests/features/fused_ops/test_stock.py runs without them.
TINY = [
    "--transformer-impl", "local", "--distributed-backend", "nccl",
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "64", "--max-position-embeddings", "64",
    "--micro-batch-size", "2", "--global-batch-size", "8",
    "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--lr-decay-iters", "8",
    "--lr-warmup-iters", "0", "--weight-decay", "0.01", "--clip-grad", "1.0",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
    "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "100000", "--seed", "1234",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--use-cpu-initialization",
    "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-bias-dropout-fusion",
    "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion",
    "--no-persist-layer-norm",
]


def mmp_executable():
    return shutil.which("mmp", path=os.path.dirname(sys.executable)) or shutil.which("mmp")


def command(route, lm_path, nproc, args):
    script = str(Path(lm_path) / "pretrain_gpt.py")
    torchrun = ["--standalone", f"--nproc-per-node={nproc}"]
    if route == "mmp":
        return [mmp_executable(), "run", *torchrun, script, *args]
    if route == "pth":
        return [sys.executable, "-m", "torch.distributed.run", *torchrun, script, *args]
    if route == "dlrover":  # dlrover-run, its agent given mmp run's side by the env hook
        return [sys.executable, "-m", "dlrover.trainer.torch.main", *torchrun, script, *args]
    if route == "ft":  # nvidia-resiliency-ext's ft_launcher, the same way
        launcher = shutil.which("ft_launcher", path=os.path.dirname(sys.executable))
        return [launcher or "ft_launcher", *torchrun, script, *args]
    if route == "import":
        return [sys.executable, "-m", "torch.distributed.run", *torchrun,
                str(FIXTURES / "import_route.py"), script, *args]
    raise ValueError(route)


def run_stock(lm_path, args, *, nproc=2, route="mmp", iters=4, env=None, cwd=None,
              timeout=900):
    """Returns (losses {iteration: loss}, ms per iteration {iteration: ms}, full log)."""
    full = [*TINY, "--train-iters", str(iters), *args]
    if "--data-path" not in args:
        full.append("--mock-data")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    # the stock tests read Megatron's whole log (its list of arguments, its INFO messages);
    # the default, brief log has its own tests (tests/features/logs/test_brief_log.py)
    run_env.update({"OMP_NUM_THREADS": "1", "MEGATRON_LM_PATH": str(lm_path),
                    "MEGATRON_MUSA_PATCH_LOG": "full", **(env or {})})
    if env and "PYTHONPATH" in env and os.environ.get("PYTHONPATH"):  # keep the caller's too
        run_env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.environ["PYTHONPATH"]])
    if route == "pth":
        run_env["MEGATRON_MUSA_PATCH"] = "1"
    proc = subprocess.Popen(command(route, lm_path, nproc, full), env=run_env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # so a hang is ended with all its ranks
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        log = end_launcher(proc)
        raise AssertionError(f"pretrain_gpt.py ({route}, {' '.join(args)}) hung for "
                             f"{timeout} s:\n{log[-4000:]}")
    if proc.returncode != 0:
        raise AssertionError(f"pretrain_gpt.py ({route}, {nproc} ranks, {' '.join(args)}) "
                             f"exited {proc.returncode}:\n{log[-4000:]}")
    losses = {int(i): float(v) for i, v in LOSS.findall(log)}
    times = {int(i): float(v) for i, v in TIME.findall(log)}
    return losses, times, log


def end_launcher(proc, grace_s=60):
    """Stop a hung launcher and its ranks; returns what they printed. torchrun starts each rank
    in a session of its own, which a signal to the launcher's group does not reach (a rank left
    running would hold the log pipe open for ever), and stops them itself on SIGTERM."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=grace_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            return proc.communicate(timeout=grace_s)[0]
        except subprocess.TimeoutExpired:
            return "(no log: a rank outlived its launcher and holds the pipe open)"


# tests/fixtures/plugins/reliability_probe.py: after every step each rank prints its
# full-precision loss and a hash of its parameters
PROBE = {"MEGATRON_MUSA_PATCH_PLUGINS": "reliability_probe",
         "PYTHONPATH": str(FIXTURES / "plugins")}
PROBE_LINE = re.compile(
    r"reliability_probe rank=(\d+) iteration=(\d+) loss=(\S+) params=([0-9a-f]{16})")


def probe_steps(log):
    """{(rank, iteration): (loss, parameter hash)} from the probe's lines in a log."""
    return {(int(r), int(i)): (loss, params) for r, i, loss, params in PROBE_LINE.findall(log)}


def write_bin_idx(prefix, *, seed=0, documents=300, max_id=999):
    """A real .bin/.idx pair of random documents (ids 1..max_id-1), written with megatron-core's
    own builder; returns the prefix for --data-path."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(documents):
        doc = rng.integers(1, max_id, size=int(rng.integers(20, 200)), dtype=np.int64)
        builder.add_document(doc, [len(doc)])
    builder.finalize(f"{prefix}.idx")
    return prefix


GROUPED_MLP_SELECTED = "The legacy GroupedMLP will be deprecated"


def assert_grouped_experts(log, release):
    """--moe-grouped-gemm on the local spec ran GroupedMLP (0.16: upstream warns when it selects
    it), or the release has none (removed in 0.17: the experts are SequentialMLP) and the patch
    table shows the layer's GroupedMLP records standing aside for that reason."""
    from megatron_musa_patch.upstream import facts

    if facts.holds("local_spec_has_grouped_mlp", release.first):
        assert GROUPED_MLP_SELECTED in log
    else:
        assert GROUPED_MLP_SELECTED not in log
        assert re.search(r"skipped\s+recompute\.grouped_experts_fc2\b", log), log[-3000:]


#: |loss - reference| per iteration: the reduction order differs across ranks
FP32_TOLERANCE = 1e-5


def assert_close(losses, reference, tol=FP32_TOLERANCE):
    """``losses`` ({iteration: loss}) has ``reference``'s iterations, each within ``tol``."""
    assert sorted(losses) == sorted(reference) and losses, (losses, reference)
    worst = max(abs(losses[i] - reference[i]) for i in reference)
    assert worst <= tol, (f"max |loss - reference| = {worst:.3e} > {tol:.0e}: "
                          f"{losses} vs {reference}")
