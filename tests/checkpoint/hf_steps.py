"""Steps the conversion tests share: running ``mmp checkpoint``, a stock pretrain_gpt.py run from
a converted checkpoint with the batch probe, transformers' loss on the batches it saw, and
comparing tensors bit for bit."""

import os
import subprocess

import torch

from tests.harness import stock as runner
from tests.checkpoint import tiny_models


def mmp(*args, lm_path, timeout=900, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_LM_PATH=str(lm_path), OMP_NUM_THREADS="1")
    proc = subprocess.run([runner.mmp_executable(), "checkpoint", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def import_hf(hf, target, layout, ckpt_format, lm_path):
    mmp("import-hf", "--hf-dir", str(hf), "--save", str(target), *layout,
        "--ckpt-format", ckpt_format, lm_path=lm_path)
    return target


def model_flags(checkpoint):
    return [part for line in (checkpoint / "model_flags.txt").read_text().splitlines()
            for part in line.split(" ", 1)]


def ranks(layout) -> dict:
    sizes = {"--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1,
             "--expert-model-parallel-size": 1}
    sizes.update({layout[i]: int(layout[i + 1]) for i in range(0, len(layout), 2)})
    tp, pp, ep = sizes.values()
    return {"nproc": tp * pp * ep, "dp": ep}


def stock(checkpoint, layout, probe_dir, lm_path, extra=(), iters=1):
    """Stock pretrain_gpt.py from ``checkpoint`` with the batch probe: (losses, log)."""
    probe_dir.mkdir(parents=True, exist_ok=True)
    probe = {"MEGATRON_MUSA_PATCH_PLUGINS": "batch_probe", "BATCH_PROBE_DIR": str(probe_dir),
             "PYTHONPATH": str(runner.FIXTURES / "plugins")}
    size = ranks(layout)
    losses, _, log = runner.run_stock(
        lm_path, [*model_flags(checkpoint), *layout, "--micro-batch-size", "1",
                  "--global-batch-size", str(size["dp"]), *extra],
        nproc=size["nproc"], iters=iters, env=probe)
    return losses, log


def batches(probe_dir, iteration):
    """The batches of ``iteration``, one per data-parallel rank."""
    joined = {}  # dp rank -> its batch, input and labels joined across pipeline stages
    for file in sorted(probe_dir.glob("batches-*.pt")):
        for seen in torch.load(file):
            if seen["iteration"] != iteration:
                continue
            batch = joined.setdefault(seen["dp"], {"input_ids": None, "labels": None})
            for key in ("input_ids", "labels"):
                if seen[key] is not None:
                    assert batch[key] is None or torch.equal(batch[key], seen[key]), \
                        f"two different {key} for data-parallel rank {seen['dp']}"
                    batch[key] = seen[key]
    found = [b for b in joined.values() if b["input_ids"] is not None and b["labels"] is not None]
    assert found and len(found) == len(joined), \
        f"the batch probe saw no whole batch of iteration {iteration}: {joined}"
    return found


def hf_loss_of(hf, seen) -> float:
    """transformers' loss on the batches Megatron averaged (one per data-parallel rank, all of
    one length)."""
    hf = tiny_models.reference(hf)
    return sum(tiny_models.hf_loss(hf, b["input_ids"], b["labels"]) for b in seen) / len(seen)


def first_losses(checkpoint, hf, layout, probe_dir, lm_path, training=()):
    """(Megatron's logged loss of iteration 1 of --finetune from ``checkpoint``, transformers'
    loss on the same tokens from ``hf``)."""
    losses, _ = stock(checkpoint, layout, probe_dir, lm_path,
                      ["--load", str(checkpoint), "--finetune", "--no-load-optim",
                       "--no-load-rng", *training])
    return losses[1], hf_loss_of(hf, batches(probe_dir, 1))


def tensors(directory):
    from safetensors import safe_open

    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, "pt") as handle:
            out.update({name: handle.get_tensor(name) for name in handle.keys()})
    return out


def assert_bitwise(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(a[name].reshape(-1).view(torch.uint8),
                           b[name].reshape(-1).view(torch.uint8)), name


#: the config fields that make the network (what export-hf must get right without a reference)
NETWORK_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                  "tie_word_embeddings", "num_local_experts", "num_experts_per_tok",
                  "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
                  "moe_intermediate_size", "n_group", "topk_group", "routed_scaling_factor",
                  "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "v_head_dim", "num_experts", "moe_intermediate_size",
                  "shared_expert_intermediate_size", "norm_topk_prob", "mlp_only_layers")


def assert_args_read_alone(checkpoint):
    """``mmp checkpoint`` read the args of this ``torch_dist`` checkpoint from their pickle alone
    (``saved_args``: no torch or megatron-core import in the command's own process), and they
    are the values megatron-core's own reader gives, where those are plain."""
    import enum

    import torch
    from megatron.core.dist_checkpointing import load_common_state_dict

    from megatron_musa_patch.checkpoint import conversion, saved_args

    directory = conversion._iteration_dir(checkpoint)
    read = saved_args.read_torch_dist(directory)
    assert read is not None, f"saved_args did not read {directory}'s args"
    expected = vars(load_common_state_dict(str(directory))["args"])
    plain = {k for k, v in expected.items() if not isinstance(v, (torch.dtype, enum.Enum, type))}
    assert set(vars(read)) == set(expected) and len(plain) > 100
    assert {k: getattr(read, k) for k in plain} == {k: expected[k] for k in plain}


#: a config field's other spelling, which the export may write instead
SPELLINGS = {"num_local_experts": "num_experts"}


def assert_config_from_args(checkpoint, hf):
    """The config export-hf makes from the checkpoint's args alone (a checkpoint import-hf did
    not write) describes the network of the original ``hf`` model."""
    import json

    from megatron_musa_patch.checkpoint import conversion, families
    from megatron_musa_patch.checkpoint.families import common

    original = json.loads((hf / "config.json").read_text())
    args = conversion.checkpoint_args(checkpoint)
    derived = families.family_from_args(args).config_from_args(
        args, {"vocab_size": int(args.padded_vocab_size)})
    for field in NETWORK_FIELDS:
        if field in original:
            # transformers 5 saves Qwen3-MoE's num_experts as num_local_experts
            value = derived.get(field, derived.get(SPELLINGS.get(field)))
            assert value == original[field], (field, value, original[field])
    head_dim = original.get("head_dim") or original["hidden_size"] // original[
        "num_attention_heads"]
    assert derived["head_dim"] == head_dim
    assert {k: v for k, v in common.rope(derived).items() if v is not None} == \
        {k: v for k, v in common.rope(original).items() if v is not None}
