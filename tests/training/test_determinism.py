"""Same seed and configuration, same losses, run to run, on CPU: a tiny megatron-core GPT on 2
CPU ranks (tensor parallel, so the RNG tracker's per-rank streams matter) with dropout on, trained
twice with one seed -- identical losses, compared exactly -- and once with another seed, which
must differ (so the comparison can fail). Runs in CI without a Megatron-LM checkout; the stock
pretrain_gpt.py counterpart is tests/training/test_determinism_stock.py.
"""

import json
import subprocess
import sys

import pytest

from tests.conftest import subprocess_env

# mmp selftest's worker with dropout switched on in its TransformerConfig
WORKER = """
import megatron_musa_patch  # activates before Megatron is imported
from megatron.core.transformer import transformer_config

pytestmark = pytest.mark.ranks

_post_init = transformer_config.TransformerConfig.__post_init__


def _with_dropout(self):
    self.hidden_dropout = self.attention_dropout = 0.1
    _post_init(self)


transformer_config.TransformerConfig.__post_init__ = _with_dropout
from megatron_musa_patch.cli import selftest_worker

selftest_worker.main()
"""


def train(tmp_path, name, seed):
    script = tmp_path / "dropout_worker.py"
    script.write_text(WORKER)
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(script), "--tp", "2", "--steps", "3", "--layers", "2", "--seed", str(seed),
           "--out", str(out)]
    proc = subprocess.run(cmd, env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
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
