"""Every tiny example variant (examples/<model>/*_tiny.sh) and the quickstart's stock path, with
the stock pretrain_gpt.py on 2 CPU ranks. Needs MEGATRON_LM_PATH."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, subprocess_env
from tests.harness.stock import LOSS

pytestmark = pytest.mark.stock

TINY = {
    "llama2_7b": "tensor-model-parallel size: 2",
    "llama3_8b": "pipeline-model-parallel size: 2",
    "mixtral_8x7b": "expert_model_parallel_size ...................... 2",
    "deepseek_v2_lite": "expert_model_parallel_size ...................... 2",
}
FIELDS = re.compile(r"tokens/s/device: ([0-9.]+) \| model TFLOP/s/device: ([0-9.e+-]+) \| "
                    r"MFU: ([0-9.]+)%")


def run_script(script, lm_path, work, timeout=600, **env):
    run_env = subprocess_env(MEGATRON_LM_PATH=str(lm_path), WORK_HOME=str(work), **env)
    # the scripts call `mmp`: the one of this interpreter's environment
    run_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + run_env.get("PATH", "")
    return subprocess.run(["bash", str(script)], env=run_env, capture_output=True, text=True,
                          timeout=timeout, cwd=work)


@pytest.mark.parametrize("model", list(TINY))
def test_tiny_variant_trains_checkpoints_and_logs_mfu(model, lm_path, tmp_path):
    script = REPO / "examples" / model / f"pretrain_{model}_tiny.sh"
    proc = run_script(script, lm_path, tmp_path, TRAIN_ITERS="3")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    losses = {int(i): float(v) for i, v in LOSS.findall(log)}
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) and 0 < v < 20
                                               for v in losses.values()), losses
    assert TINY[model] in log
    # the script's own arguments reached Megatron (bf16, distributed optimizer, recompute)
    assert re.search(r"bf16 \.+ True", log) and re.search(r"use_distributed_optimizer \.+ True",
                                                          log)
    for flag in ("attn_recompute", "mlp_recompute", "recompute_variance"):
        assert re.search(rf"{flag} \.+ True", log), flag
    ckpt = tmp_path / "checkpoints" / model / "latest_checkpointed_iteration.txt"
    assert ckpt.read_text().strip() == "3"
    fields = FIELDS.findall(log)
    assert len(fields) == 3 and all(float(t) > 0 and float(f) > 0 and float(m) > 0
                                    for t, f, m in fields), fields
    assert "device peak" in log and "(bf16, measured:" in log


def test_deepseek_tiny_is_mla_and_moe(lm_path, tmp_path):
    proc = run_script(REPO / "examples" / "deepseek_v2_lite" / "pretrain_deepseek_v2_lite_tiny.sh",
                      lm_path, tmp_path, TRAIN_ITERS="1")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert re.search(r"multi_latent_attention \.+ True", log)
    assert re.search(r"moe_layer_freq \.+ \[0, 1, 1\]", log)
    assert "seq_load_balancing_loss" in log
    assert "device_level_balancing_loss" in log and "communication_balancing_loss" in log
    # MoE and MLA: our count and upstream's differ, and the start-up line says why
    assert "upstream leaves out the MoE router GEMM" in log
    assert "upstream counts the MLA q/kv RMSNorms as GEMM FLOPs" in log


def test_full_size_script_needs_data(lm_path, tmp_path):
    proc = run_script(REPO / "examples" / "llama2_7b" / "pretrain_llama2_7b.sh", lm_path,
                      tmp_path, timeout=60)
    assert proc.returncode == 1
    assert "set DATA_PATH" in proc.stderr and "TOKENIZER_MODEL" in proc.stderr


def test_quickstart_stock_path(lm_path, tmp_path):
    """--ci with a checkout: the stock pretrain_gpt.py trains, stops with a checkpoint at
    half-way, and resumes from it."""
    proc = subprocess.run(
        ["bash", str(REPO / "examples" / "quickstart.sh"), "--ci", "--python", sys.executable,
         "--workdir", str(tmp_path / "run"), "--iters", "8"],
        env=subprocess_env(MEGATRON_LM_PATH=str(lm_path), MMP_CACHE_DIR=str(tmp_path / "c")),
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run = tmp_path / "run"
    first, second = (run / "train-1.log").read_text(), (run / "train-2.log").read_text()
    assert sorted(int(i) for i, _ in LOSS.findall(first)) == [1, 2, 3, 4]
    assert re.search(r"successfully loaded checkpoint from checkpoints .*at iteration 4", second)
    assert sorted(int(i) for i, _ in LOSS.findall(second)) == [5, 6, 7, 8]
    assert "SKIPPED" not in proc.stdout and "stock pretrain_gpt.py from" in proc.stdout
    assert len(FIELDS.findall(first)) == 4 and "MFU" in proc.stdout
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "8"
    assert Path(run / "summary.json").is_file()
