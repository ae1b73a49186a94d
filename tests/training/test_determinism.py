"""Same seed and configuration, same losses, run to run, on CPU: a tiny megatron-core GPT on 2 CPU
ranks (tensor parallel, so the RNG tracker's per-rank streams matter) with dropout on
(tests/training/dropout_worker.py), trained twice with one seed -- identical losses, compared
exactly -- and once with another seed, which must differ (so the comparison can fail). Runs in CI
without a Megatron-LM checkout; the stock pretrain_gpt.py counterpart is
tests/training/test_determinism_stock.py.
"""

import pytest

from tests.harness.tiny_gpt import torchrun_json

pytestmark = pytest.mark.ranks


def train(tmp_path, name, seed):
    result = torchrun_json("tests.training.dropout_worker", tmp_path / f"{name}.json",
                           "--seed", seed, timeout=600)
    assert result["device"] == "cpu" and result["world_size"] == 2
    return result["losses"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("determinism")
    return {name: train(tmp, name, seed) for name, seed in
            (("first", 1234), ("again", 1234), ("other-seed", 99))}


def test_same_seed_gives_identical_losses(runs):
    assert len(runs["first"]) == 3
    assert runs["first"] == runs["again"], runs  # exact float equality, every step


def test_another_seed_gives_other_losses(runs):
    assert all(a != b for a, b in zip(runs["first"], runs["other-seed"])), runs
