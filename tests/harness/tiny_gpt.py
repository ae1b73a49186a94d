"""The tests' tiny-GPT harness: the model ``mmp selftest`` trains
(``megatron_musa_patch.cli.tiny_gpt``), driven by test workers under torchrun.

A worker module (``tests/features/fused_ops/fused_ops_worker.py``, say) imports the model and
training steps from here, changes what its check is about (a fusion on, an optimizer
configuration, a recompute flag) and writes a JSON result from rank 0; its test starts it with
``torchrun`` below and compares results with ``max_abs_diff``. Importing this module activates
the layer (the package's import does), before Megatron is imported; the test-side helpers
import nothing of pytest's until a test calls them.
"""

from __future__ import annotations

import json

from megatron_musa_patch.cli.tiny_gpt import (DEFAULTS, batches, build_chunks,
                                              build_model, forward_step, init_parallel, options,
                                              rank_batches, seed, train_steps, wrap)

__all__ = ["DEFAULTS", "batches", "build_chunks", "build_model", "forward_step", "init_parallel",
           "options", "rank_batches", "seed", "train_steps", "wrap",  # the model's
           "torchrun", "torchrun_json", "max_abs_diff"]  # the harness's


def torchrun(worker, *args, nproc=2, timeout=900, **env):
    """Run the worker module (``tests.features.fusion_worker``) on ``nproc`` CPU ranks with
    ``--standalone`` torchrun, from the repository root; ``env`` adds variables. Returns the
    finished process after asserting it exited cleanly."""
    from tests.conftest import run_probe, subprocess_env  # the test process's side only

    proc = run_probe("torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                     "-m", worker, *args, timeout=timeout,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu", **env))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def torchrun_json(worker, out, *args, **kwargs):
    """``torchrun`` with ``--out out``, then the JSON rank 0 wrote there."""
    torchrun(worker, *args, "--out", out, **kwargs)
    with open(out) as f:
        return json.load(f)


def max_abs_diff(a, b, length=None):
    """The largest elementwise difference of two equally long sequences of numbers (of
    ``length`` each, when given: a run that stopped early is not a match)."""
    assert len(a) == len(b) and length in (None, len(a)), (length, a, b)
    return max(abs(x - y) for x, y in zip(a, b))
