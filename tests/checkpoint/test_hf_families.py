"""mmp checkpoint on every family it maps, against transformers (needs MEGATRON_LM_PATH).

For each family a tiny model made by transformers (random weights) is imported at a parallel
layout; the first iteration of stock pretrain_gpt.py --finetune from it logs the loss
transformers computes on the same tokens (fp32, within 1e-5 relative; the tokens are those the
batch probe saw); export-hf gives back the original tensors bit for bit. CI runs the Llama case
(tests/checkpoint/test_hf_llama.py runs it with training); the rest run with the whole stock
suite."""

import json

import pytest
import torch

from megatron_musa_patch.checkpoint.conversion import checkpoint_args

from tests.checkpoint import tiny_models
from tests.checkpoint.hf_steps import (assert_bitwise, assert_config_from_args, first_losses,
                                       import_hf, mmp, tensors)

pytestmark = pytest.mark.stock

#: training flags a layout needs beyond its sizes: MoE with TP asks for sequence parallelism
TRAINING = {"mixtral-tp2": ["--sequence-parallel"], "deepseek_v3-tp2": ["--sequence-parallel"],
            "deepseek_v2_lite": ["--sequence-parallel"], "qwen2_moe": ["--sequence-parallel"]}
LAYOUTS = {
    "llama31": (["--tensor-model-parallel-size", "2"], "torch_dist"),
    "qwen2": (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
              "torch"),
    "qwen3": (["--tensor-model-parallel-size", "2"], "torch_dist"),
    "mixtral": (["--expert-model-parallel-size", "2"], "torch_dist"),
    "deepseek_v3": (["--expert-model-parallel-size", "2"], "torch_dist"),
    "deepseek_v3_mtp": (["--pipeline-model-parallel-size", "2"], "torch_dist"),
    "deepseek_v3_fp8": (["--expert-model-parallel-size", "2"], "torch_dist"),
    "deepseek_v2_lite": (["--tensor-model-parallel-size", "2", "--expert-model-parallel-size",
                          "2"], "torch_dist"),
    "deepseek_v2": (["--expert-model-parallel-size", "2"], "torch"),
    "deepseek_v3-tp2": (["--tensor-model-parallel-size", "2", "--expert-model-parallel-size",
                         "2"], "torch"),
    "mixtral-tp2": (["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2"],
                    "torch"),
    "qwen3_moe": (["--expert-model-parallel-size", "2"], "torch_dist"),
    "qwen2_moe": (["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2"],
                  "torch"),
    "phi3": (["--tensor-model-parallel-size", "2"], "torch_dist"),
    "phi4_mini": (["--pipeline-model-parallel-size", "2"], "torch"),
    "moonlight": (["--expert-model-parallel-size", "2"], "torch_dist"),
    "kimi_k2": (["--expert-model-parallel-size", "2"], "torch"),
}


#: the families whose config export-hf makes from a checkpoint's args alone (the others, Phi-3
#: and Kimi-K2, export with the config import-hf kept; without it they export as the Llama or
#: DeepSeek-V3 network they are)
CONFIG_FROM_ARGS = {family.split("-")[0] for family in LAYOUTS} - {"phi3", "phi4_mini", "kimi_k2"}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_family_matches_transformers_and_exports_bit_for_bit(lm_path, tmp_path, case):
    family = case.split("-")[0]  # llama31, qwen2, ..., mixtral-tp2 -> mixtral
    layout, ckpt_format = LAYOUTS[case]
    hf = tiny_models.make(family, tmp_path)
    imported = import_hf(hf, tmp_path / "imported", layout, ckpt_format, lm_path)
    if family in CONFIG_FROM_ARGS:
        assert_config_from_args(imported, hf)
    megatron, expected = first_losses(imported, hf, layout, tmp_path, lm_path,
                                      TRAINING.get(case, ()))
    assert megatron == pytest.approx(expected, rel=1e-5), (megatron, expected)
    exported = tmp_path / "exported"
    mmp("export-hf", "--load", str(imported), "--hf-dir", str(exported), lm_path=lm_path)
    assert_bitwise(dequantized(hf, exported) if family.endswith("_fp8") else tensors(hf),
                   tensors(exported))
    flags = (imported / "model_flags.txt").read_text()
    # a sequence length (pretrain_gpt.py needs one; a Hugging Face config has none)
    positions = json.loads((hf / "config.json").read_text())["max_position_embeddings"]
    assert f"--seq-length {min(positions, 4096)}\n" in flags
    if family in tiny_models.WITH_TOKENIZER:  # imported with its tokenizer, exported with it
        # the checkpoint's own copy, so the source directory may go
        assert f"--tokenizer-model {imported / 'hf_reference'}\n" in flags
        assert "--tokenizer-type HuggingFaceTokenizer" in flags
        assert (exported / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()


def dequantized(hf, exported):
    """The FP8 model's tensors as the import reads them (weight x its block's scale), after
    checking them against transformers' own dequantization of the directory; the export gives
    these back, with a config that no longer says FP8."""
    import json

    from transformers import AutoModelForCausalLM

    from megatron_musa_patch.checkpoint.hf import HFCheckpoint

    source = HFCheckpoint(hf)
    out = {name: source.get(name) for name in source.names()}
    theirs = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).state_dict()
    compared = [n for n in out if n in theirs and n.endswith("_proj.weight")]
    assert len(compared) >= 10  # attention, dense MLP and shared experts (experts are fused)
    for name in compared:
        assert torch.equal(out[name], theirs[name]), name
    assert "quantization_config" not in json.loads((exported / "config.json").read_text())
    return out


def test_bf16_round_trip_is_bit_for_bit(lm_path, tmp_path):
    """A bf16 model (as released models are) stays bf16 through import (--bf16 in its flags),
    the TP2 torch-format resave and the export: the exported tensors are the original bits."""
    hf = tiny_models.make("qwen2", tmp_path, dtype="bfloat16")
    imported = import_hf(hf, tmp_path / "imported", ["--tensor-model-parallel-size", "2"],
                         "torch", lm_path)
    assert "--bf16" not in (imported / "model_flags.txt").read_text()  # a training choice
    args = checkpoint_args(imported)
    # the args as mmp checkpoint reads them: torch's dtype is a stand-in that names itself
    assert args.bf16 and args.params_dtype.where == "torch.bfloat16"
    exported = tmp_path / "exported"
    mmp("export-hf", "--load", str(imported), "--hf-dir", str(exported), lm_path=lm_path)
    original = tensors(hf)
    assert {t.dtype for t in original.values()} == {torch.bfloat16}
    assert_bitwise(original, tensors(exported))
