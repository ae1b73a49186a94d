"""Same seed and configuration, same results, run to run: the stock pretrain_gpt.py (core_v0.16.1,
unmodified) on 2 CPU ranks, tensor parallel, dropout on, run twice -- every rank's full-precision
loss and parameter hash after every step are identical (tests/fixtures/plugins/
reliability_probe.py); another seed changes them. The CI counterpart (megatron-core alone) is
tests/training/test_determinism.py. Needs MEGATRON_LM_PATH."""

import pytest

from tests.harness.stock import PROBE, probe_steps, run_stock

pytestmark = pytest.mark.stock

ARGS = ["--tensor-model-parallel-size", "2", "--hidden-dropout", "0.1",
        "--attention-dropout", "0.1"]


def probe(lm_path, *extra):
    _, _, log = run_stock(lm_path, [*ARGS, *extra], iters=3, env=PROBE)
    steps = probe_steps(log)
    assert len(steps) == 6, log[-3000:]
    return steps


def test_same_seed_same_losses_and_parameters(lm_path):
    first, again = probe(lm_path), probe(lm_path)
    assert first == again
    other = probe(lm_path, "--seed", "4321")
    assert all(other[k] != first[k] for k in first)
