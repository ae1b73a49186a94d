"""Damaged inputs and the families this conversion refuses, each refused in one paragraph, exit
2, before any model is built (docs/bad_inputs.md rows 98-101). In-process, no Megatron needed:
a step running would fail the test."""

import json

import pytest
import torch

from megatron_musa_patch.checkpoint import families
from megatron_musa_patch.checkpoint.hf import tensor_names

from tests.checkpoint.test_refusals import LLAMA, hf_dir, imported, lm_path, refused  # noqa: F401


def cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def test_a_model_file_cut_in_half(capsys, tmp_path):
    source = hf_dir(tmp_path, LLAMA)
    whole = (source / "model.safetensors").stat().st_size
    cut(source / "model.safetensors")
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o")])
    assert f"model.safetensors is {whole // 2} bytes where its header says {whole}" in err
    assert "cut short" in err and "Nothing was written" in err


def test_one_shard_of_three_cut_in_half(capsys, tmp_path):
    from safetensors.torch import save_file

    source = hf_dir(tmp_path, LLAMA, weights=False)
    weight_map = {}
    for number, name in enumerate(("model.embed_tokens.weight", "model.norm.weight",
                                   "lm_head.weight"), start=1):
        file = f"model-{number:05d}-of-00003.safetensors"
        save_file({name: torch.ones(64, 16)}, str(source / file))
        weight_map[name] = file
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cut(source / "model-00002-of-00003.safetensors")
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o")])
    assert "model-00002-of-00003.safetensors is" in err and "cut short" in err


def test_a_header_that_does_not_read_and_an_index_of_other_shards(capsys, tmp_path):
    source = hf_dir(tmp_path, LLAMA)
    (source / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o")])
    assert "model.safetensors is not a safetensors file" in err
    other = hf_dir(tmp_path, LLAMA, name="other")
    (other / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "model.safetensors"}}))
    err = refused(capsys, ["import-hf", "--hf-dir", str(other), "--save", str(tmp_path / "o")])
    assert "puts lm_head.weight in model.safetensors, whose header does not hold it" in err


def test_a_config_that_is_not_json(capsys, tmp_path):
    source = hf_dir(tmp_path, LLAMA)
    (source / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], ')
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o")])
    assert "config.json is not JSON (Expecting property name enclosed in double quotes at " \
           "line 1, column 41)" in err


def test_the_header_reader_agrees_with_safetensors(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    save_file({"a": torch.ones(3, 5), "b": torch.zeros(7, dtype=torch.bfloat16)},
              str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    with safe_open(tmp_path / "m.safetensors", "pt") as handle:
        assert sorted(tensor_names(tmp_path / "m.safetensors")) == sorted(handle.keys())


def test_export_into_a_file_and_from_a_garbled_tracker(capsys, tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "iter_0000010").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1\x00garbage")
    err = refused(capsys, ["export-hf", "--load", str(ckpt), "--hf-dir", str(tmp_path / "hf")])
    assert "latest_checkpointed_iteration.txt holds '1\\x00garbage', not an iteration number" in err
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20")
    err = refused(capsys, ["export-hf", "--load", str(ckpt), "--hf-dir", str(tmp_path / "hf")])
    assert "names iteration 20, and iter_0000020 is not there" in err
    (tmp_path / "a_file").write_text("mine")
    err = refused(capsys, ["import-hf", "--hf-dir", str(hf_dir(tmp_path, LLAMA)),
                           "--save", str(tmp_path / "a_file")])
    assert f"--save {tmp_path / 'a_file'} exists and is a file" in err
    assert (tmp_path / "a_file").read_text() == "mine"


def test_export_into_an_existing_file(capsys, tmp_path, monkeypatch):
    from megatron_musa_patch.checkpoint import conversion

    args = type("Args", (), dict(num_layers=1, hidden_size=16, num_attention_heads=2,
                                 padded_vocab_size=64, load=None))()
    monkeypatch.setattr(conversion, "checkpoint_args", lambda load: args)
    config = hf_dir(tmp_path, LLAMA, weights=False, name="config")
    (tmp_path / "a_file").write_text("mine")
    err = refused(capsys, ["export-hf", "--load", str(tmp_path), "--hf-dir",
                           str(tmp_path / "a_file"), "--hf-config", str(config)])
    assert f"--hf-dir {tmp_path / 'a_file'} exists and is a file" in err
    assert (tmp_path / "a_file").read_text() == "mine"


GEMMA3 = {**LLAMA, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}


def test_gemma3_is_refused_naming_each_missing_piece(capsys, tmp_path):
    err = imported(capsys, tmp_path, GEMMA3)
    for piece in ("GeGLU with the tanh-approximated GELU", "1 + weight",
                  "a norm after the attention and after the MLP", "embedding scaled",
                  "sliding-window attention", "query_pre_attn_scalar"):
        assert piece in err, piece
    assert err.count("Nothing was written") == 1


@pytest.mark.parametrize("config, says", [
    ({**LLAMA, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "sliding_window": 16},
     "sliding_window=16 below max_position_embeddings=32"),
    ({**LLAMA, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
      "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}},
     "rope_type 'longrope' is not supported"),
    ({**LLAMA, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0"),
    ({**LLAMA, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "use_sliding_window": True}, "use_sliding_window=True"),
    ({**LLAMA, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k3"},
     "expected 'deepseek_v3' or 'kimi_k2'"),
])
def test_new_families_refuse_what_megatron_would_compute_otherwise(capsys, tmp_path, config,
                                                                   says):
    err = imported(capsys, tmp_path, config)
    assert says in err, err


def test_export_makes_a_config_only_for_one_model_type():
    """A checkpoint's args name one model type (or none): the export's config of a checkpoint
    without one is that type's, and args no type describes are refused."""
    from types import SimpleNamespace

    from megatron_musa_patch.checkpoint.errors import ConversionError

    def args(**kw):
        return SimpleNamespace(**{"num_experts": None, "multi_latent_attention": False,
                                  "add_qkv_bias": False, "qk_layernorm": False,
                                  "moe_shared_expert_intermediate_size": None, **kw})

    assert families.family_from_args(args()).model_type == "llama"
    assert families.family_from_args(args(qk_layernorm=True)).model_type == "qwen3"
    assert families.family_from_args(args(num_experts=8)).model_type == "mixtral"
    assert families.family_from_args(args(num_experts=8, qk_layernorm=True)).model_type == \
        "qwen3_moe"
    assert families.family_from_args(args(
        num_experts=8, add_qkv_bias=True, moe_shared_expert_intermediate_size=48,
        moe_shared_expert_gate=True)).model_type == "qwen2_moe"
    for other in ({"moe_shared_expert_intermediate_size": 48},  # a shared expert, no gate
                  {"add_qkv_bias": True, "moe_shared_expert_intermediate_size": 48},
                  {"moe_router_score_function": "sigmoid"},  # no softmax-routed family's
                  {"moe_router_topk_scaling_factor": 2.5}):
        with pytest.raises(ConversionError, match="describe no model type"):
            families.family_from_args(args(num_experts=8, **other))
