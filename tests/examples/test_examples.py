"""Every tiny example variant (examples/<model>/*_tiny.sh) and the quickstart's stock path, with
the stock pretrain_gpt.py on 2 CPU ranks (marked stock: needs MEGATRON_LM_PATH); the two-node
launcher (examples/multinode/), which needs no Megatron-LM."""

import math
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, subprocess_env
from tests.harness.stock import LOSS

stock = pytest.mark.stock

TINY = {
    "llama2_7b": "tensor-model-parallel size: 2",
    "llama3_8b": "pipeline-model-parallel size: 2",
    "llama31_8b": "pipeline-model-parallel size: 2",
    "qwen25_7b": "tensor-model-parallel size: 2",
    "qwen3_8b": "tensor-model-parallel size: 2",
    "mixtral_8x7b": "expert_model_parallel_size ...................... 2",
    "deepseek_v2_lite": "expert_model_parallel_size ...................... 2",
    "deepseek_v3": "expert_model_parallel_size ...................... 2",
}
#: what sets a tiny variant's model apart, as Megatron prints its arguments (or logs)
MODEL_SHOWN = {
    "llama31_8b": [r"use_rope_scaling \.+ True", r"rope_scaling_factor \.+ 8\.0",
                   r"rotary_base \.+ 500000\n"],
    "qwen25_7b": [r"add_qkv_bias \.+ True", r"qk_layernorm \.+ False",
                  r"rotary_base \.+ 1000000\n", r"untie_embeddings_and_output_weights \.+ True"],
    "qwen3_8b": [r"qk_layernorm \.+ True", r"add_qkv_bias \.+ False", r"kv_channels \.+ 16\n",
                 r"rotary_base \.+ 1000000\n"],
    "deepseek_v3": [r"multi_latent_attention \.+ True", r"q_lora_rank \.+ 48\n",
                    r"moe_layer_freq \.+ \[0, 1, 1, 1\]", r"num_experts \.+ 8\n",
                    r"moe_router_score_function \.+ sigmoid",
                    r"moe_router_enable_expert_bias \.+ True",
                    r"moe_router_num_groups \.+ 4\n", r"moe_router_group_topk \.+ 2\n",
                    r"moe_router_topk_scaling_factor \.+ 2\.5", r"mtp_num_layers \.+ 1\n",
                    r"mtp_1 loss: [0-9.E+-]+", r"seq_load_balancing_loss: [0-9.E+-]+"],
}
FIELDS = re.compile(r"tokens/s/device: ([0-9.]+) \| model TFLOP/s/device: ([0-9.e+-]+) \| "
                    r"MFU: ([0-9.]+)%")


def run_script(script, lm_path, work, timeout=600, **env):
    run_env = subprocess_env(MEGATRON_LM_PATH=str(lm_path), WORK_HOME=str(work), **env)
    # the scripts call `mmp`: the one of this interpreter's environment
    run_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + run_env.get("PATH", "")
    return subprocess.run(["bash", str(script)], env=run_env, capture_output=True, text=True,
                          timeout=timeout, cwd=work)


@stock
@pytest.mark.parametrize("model", list(TINY))
def test_tiny_variant_trains_checkpoints_and_logs_mfu(model, lm_path, tmp_path):
    script = REPO / "examples" / model / f"pretrain_{model}_tiny.sh"
    # Megatron's list of arguments, to check what the script passed (brief by default)
    proc = run_script(script, lm_path, tmp_path, TRAIN_ITERS="3", MEGATRON_MUSA_PATCH_LOG="full")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    losses = {int(i): float(v) for i, v in LOSS.findall(log)}
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) and 0 < v < 20
                                               for v in losses.values()), losses
    assert TINY[model] in log
    for shown in MODEL_SHOWN.get(model, ()):
        assert re.search(shown, log), shown
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


@stock
def test_deepseek_tiny_is_mla_and_moe(lm_path, tmp_path):
    proc = run_script(REPO / "examples" / "deepseek_v2_lite" / "pretrain_deepseek_v2_lite_tiny.sh",
                      lm_path, tmp_path, TRAIN_ITERS="1", MEGATRON_MUSA_PATCH_LOG="full")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert re.search(r"multi_latent_attention \.+ True", log)
    assert re.search(r"moe_layer_freq \.+ \[0, 1, 1\]", log)
    assert "seq_load_balancing_loss" in log
    assert "device_level_balancing_loss" in log and "communication_balancing_loss" in log
    # MoE and MLA: our count and upstream's differ, and the start-up line says why
    assert "upstream leaves out the MoE router GEMM" in log
    assert "upstream counts the MLA q/kv RMSNorms as GEMM FLOPs" in log


def small_corpus(root, documents=50):
    """A tokenizer trained offline and ``documents`` short documents prepared and blended with
    `mmp data`, as a user's first corpus; returns (DATA_PATH, TOKENIZER_MODEL)."""
    from tests.data.mmp_data_helpers import make_docs, write_jsonl

    (root / "corpus").mkdir(parents=True)
    write_jsonl(root / "corpus" / "docs.jsonl", make_docs(documents, seed=3, empties=False))
    mmp = [os.path.join(os.path.dirname(sys.executable), "mmp"), "data"]
    steps = [["train-tokenizer", "--input", root / "corpus", "--output-dir", root / "tok",
              "--vocab-size", "600", "--min-frequency", "1"],
             ["prepare", "--input", root / "corpus", "--output-dir", root / "data",
              "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", root / "tok",
              "--append-eod", "--workers", "1"],
             ["blend", root / "data"]]
    for step in steps:
        proc = subprocess.run([*mmp, *map(str, step)], env=subprocess_env(), capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{documents} documents" in proc.stderr, proc.stderr
    return proc.stdout.strip(), root / "tok"


@stock
def test_tiny_variant_trains_on_a_50_document_corpus(lm_path, tmp_path):
    """As the script stands, on real data too small for a 1% validation share: with
    EVAL_ITERS=0 it asks for no validation share (upstream would spin building an empty one)."""
    data_path, tokenizer = small_corpus(tmp_path / "c")
    proc = run_script(REPO / "examples" / "llama3_8b" / "pretrain_llama3_8b_tiny.sh", lm_path,
                      tmp_path, timeout=300, DATA_PATH=data_path, TOKENIZER_MODEL=tokenizer)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    command = proc.stdout.splitlines()[0]
    assert f"--data-path {data_path} " in command and "--mock-data" not in command
    assert "--split 100,0,0" in command
    losses = {int(i): float(v) for i, v in LOSS.findall(log)}
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) and 0 < v < 20
                                               for v in losses.values()), losses


def split_given(tmp_path, script, **env):
    """The --split a model script passes to pretrain_gpt.py, read from the command it prints
    (a stand-in `mmp` ends the run there; no Megatron is needed)."""
    bin_dir, lm = tmp_path / "bin", tmp_path / "lm"
    bin_dir.mkdir(exist_ok=True)
    lm.mkdir(exist_ok=True)
    (lm / "pretrain_gpt.py").write_text("")
    (bin_dir / "mmp").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "mmp").chmod(0o755)
    run_env = subprocess_env(MEGATRON_LM_PATH=str(lm), WORK_HOME=str(tmp_path / "w"),
                             DATA_PATH="1 /data/docs_document", TOKENIZER_MODEL="/models/t",
                             **env)
    run_env["PATH"] = f"{bin_dir}{os.pathsep}{run_env.get('PATH', '')}"
    proc = subprocess.run(["bash", str(REPO / "examples" / script)], env=run_env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout.splitlines()[0])
    return words[words.index("--split") + 1]


def test_split_follows_the_evaluation_settings(tmp_path):
    """No validation share when nothing is evaluated (EVAL_ITERS=0: the tiny variants), 99,1,0
    with evaluation (the full-size default), and a SPLIT the user sets is kept."""
    tiny, full = "llama3_8b/pretrain_llama3_8b_tiny.sh", "llama3_8b/pretrain_llama3_8b.sh"
    assert split_given(tmp_path, tiny) == "100,0,0"
    assert split_given(tmp_path, full) == "99,1,0"
    assert split_given(tmp_path, full, EVAL_ITERS="0") == "100,0,0"
    assert split_given(tmp_path, tiny, SPLIT="99,1,0") == "99,1,0"
    assert split_given(tmp_path, full, SPLIT="90,5,5") == "90,5,5"


@stock
def test_full_size_script_needs_data(lm_path, tmp_path):
    proc = run_script(REPO / "examples" / "llama2_7b" / "pretrain_llama2_7b.sh", lm_path,
                      tmp_path, timeout=60)
    assert proc.returncode == 1
    assert "set DATA_PATH" in proc.stderr and "TOKENIZER_MODEL" in proc.stderr


@stock
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


LAUNCHER = REPO / "examples" / "multinode" / "launch_two_nodes.sh"


def launch_env(**env):
    """This environment with only ``env`` of the launcher's variables (none from a SLURM job the
    tests may run in), and this interpreter's ``mmp`` first on PATH."""
    run_env = {k: v for k, v in subprocess_env().items()
               if k not in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "GPUS_PER_NODE",
                            "DRY_RUN", "HOSTFILE") and not k.startswith("SLURM_")}
    run_env.update({k: str(v) for k, v in env.items()})
    run_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + run_env.get("PATH", "")
    return run_env


def launch(*args, timeout=60, **env):
    return subprocess.run(["bash", str(LAUNCHER), *map(str, args)], env=launch_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def option(words, name):
    return words[words.index(name) + 1]


def test_two_node_launcher_dry_run():
    """--dry-run prints, for node 0 and node 1, the one mmp run line each node would start."""
    script = ["/lm/pretrain_gpt.py", "--num-layers", "2", "--data-path", "1 /data/a"]
    for rank in (0, 1):
        proc = launch("--dry-run", *script, NODE_RANK=rank, MASTER_ADDR="10.1.2.3")
        assert proc.returncode == 0, proc.stderr
        words = shlex.split(proc.stdout)
        assert words[:2] == ["mmp", "run"] and words[-len(script):] == script, words
        assert option(words, "--nnodes") == "2" and option(words, "--node-rank") == str(rank)
        assert option(words, "--master-addr") == "10.1.2.3"
        assert option(words, "--master-port") == "29500"
        assert option(words, "--nproc-per-node") == "8"
    # SLURM: the rank from SLURM_NODEID; DRY_RUN=1 spells the same; no script: the comm benchmark
    proc = launch(DRY_RUN="1", SLURM_NODEID="1", SLURM_NNODES="2", MASTER_ADDR="node-a",
                  GPUS_PER_NODE="4")
    words = shlex.split(proc.stdout)
    assert option(words, "--node-rank") == "1" and option(words, "--master-addr") == "node-a"
    assert option(words, "--nproc-per-node") == "4"
    assert words[words.index("--max-restarts") + 2].endswith("examples/comm/comm_bench.py")
    # a model script of examples/: common.sh gets the two-node variables
    proc = launch("--dry-run", REPO / "examples" / "llama3_8b" / "pretrain_llama3_8b.sh",
                  NODE_RANK=1, MASTER_ADDR="10.1.2.3", MASTER_PORT="23456")
    words = shlex.split(proc.stdout)
    for setting in ("NNODES=2", "NODE_RANK=1", "MASTER_ADDR=10.1.2.3", "MASTER_PORT=23456"):
        assert setting in words, (setting, words)
    assert words[-1].endswith("pretrain_llama3_8b.sh")


@pytest.mark.parametrize("env, message", [
    (dict(MASTER_ADDR="10.1.2.3"), "set NODE_RANK"),
    (dict(NODE_RANK="1"), "set MASTER_ADDR"),
    (dict(NODE_RANK="2", MASTER_ADDR="10.1.2.3"), "NODE_RANK=2: it is 0 or 1"),
    (dict(SLURM_NNODES="4", SLURM_NODEID="0", MASTER_ADDR="n0"), "this SLURM job has 4 nodes"),
])
def test_two_node_launcher_refuses(env, message):
    proc = launch("--dry-run", **env)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr


@pytest.mark.ranks
def test_two_node_launcher_rendezvous_on_one_host():
    """Both nodes' commands on this host (1 CPU rank each, gloo): they meet at MASTER_ADDR and
    run the comm benchmark as one 2-rank job. Two hosts need a network this cannot show."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bench = ["-b", "8", "-e", "1K", "-f", "4", "-n", "2", "-w", "1", "--ops", "all_reduce,sendrecv"]
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GPUS_PER_NODE="1",
               MEGATRON_MUSA_PATCH_DEVICE="cpu")
    node1 = subprocess.Popen(
        ["bash", str(LAUNCHER), str(REPO / "examples" / "comm" / "comm_bench.py"), *bench],
        env=launch_env(NODE_RANK=1, **env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        node0 = launch(REPO / "examples" / "comm" / "comm_bench.py", *bench, timeout=300,
                       NODE_RANK="0", **env)
        out1 = node1.communicate(timeout=120)[0]
    finally:
        node1.kill()
    assert node0.returncode == 0 and node1.returncode == 0, node0.stdout + node0.stderr + out1
    assert "node 0 of 2: mmp run" in node0.stdout and "node 1 of 2: mmp run" in out1
    assert "# comm_bench: 2 ranks, device cpu" in node0.stdout
    # every result checked element by element (a wrong one would have made the status 1)
    assert "# all_reduce: avg bus bandwidth" in node0.stdout
    assert "# sendrecv: avg bus bandwidth" in node0.stdout

