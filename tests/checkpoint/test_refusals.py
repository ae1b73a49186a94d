"""mmp checkpoint refuses what it cannot convert with one paragraph naming the culprit, before
anything is written (docs/bad_inputs.md rows 77-80). In-process, no Megatron needed."""

import json
from pathlib import Path

import pytest
import torch

from megatron_musa_patch.checkpoint import cli, conversion, families

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
         "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_act": "silu",
         "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
         "rope_theta": 10000.0, "dtype": "float32"}


def _flags(config: dict):
    """The Megatron flags of ``config``'s table."""
    return families.family_of(config).flags(config)


def hf_dir(root: Path, config: dict, weights=True, name="model") -> Path:
    from safetensors.torch import save_file

    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        save_file({"model.embed_tokens.weight": torch.zeros(64, 16)},
                  str(path / "model.safetensors"))
    return path


def refused(capsys, argv):
    code = cli.main(argv)
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    # the command as typed names itself, as argparse does
    assert err.startswith(f"mmp checkpoint {argv[0]}: error: ") and "Traceback" not in err
    return err


@pytest.fixture(autouse=True)
def lm_path(tmp_path, monkeypatch):
    """A stand-in checkout: the refusals come before any Megatron step would run."""
    checkout = tmp_path / "lm"
    checkout.mkdir()
    (checkout / "gpt_builders.py").write_text("")
    monkeypatch.setenv("MEGATRON_LM_PATH", str(checkout))
    monkeypatch.setattr(conversion, "run_step", lambda *a, **k: pytest.fail("a step ran"))


def imported(capsys, tmp_path, config, **kw):
    source = hf_dir(tmp_path, config, **kw)
    out = tmp_path / "out"
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(out)])
    assert not out.exists(), "a refusal wrote the checkpoint directory"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]
    return err


def test_an_architecture_no_family_maps(capsys, tmp_path):
    err = imported(capsys, tmp_path, {**LLAMA, "architectures": ["GPT2LMHeadModel"],
                                      "model_type": "gpt2"})
    assert "architecture ['GPT2LMHeadModel']" in err and "Nothing was written" in err
    for name in families.supported_architectures():
        assert name in err


def test_a_config_field_no_mapping_knows(capsys, tmp_path):
    err = imported(capsys, tmp_path, {**LLAMA, "partial_rotary_factor": 0.5})
    assert "partial_rotary_factor" in err and "does not know" in err


@pytest.mark.parametrize("field, value, says", [
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_type 'yarn'"),
    ("hidden_act", "gelu", "hidden_act='gelu'"),
    ("attention_bias", True, "attention_bias=True"),
])
def test_a_known_field_with_a_value_megatron_cannot_build(capsys, tmp_path, field, value, says):
    err = imported(capsys, tmp_path, {**LLAMA, field: value})
    assert says in err and "Nothing was written" in err


def test_llama31_rope_with_other_fixed_frequencies(capsys, tmp_path):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    err = imported(capsys, tmp_path, {**LLAMA, "rope_scaling": rope})
    assert "low_freq_factor=2.0" in err and "--use-rope-scaling" in err


def test_mistral_with_a_sliding_window(capsys, tmp_path):
    err = imported(capsys, tmp_path, {**LLAMA, "architectures": ["MistralForCausalLM"],
                                      "model_type": "mistral", "sliding_window": 4096})
    assert "sliding_window=4096" in err


def test_an_edited_model_type(capsys, tmp_path):
    err = imported(capsys, tmp_path, {**LLAMA, "model_type": "qwen2"})
    assert "model_type 'qwen2'" in err and "expected 'llama'" in err


def test_a_directory_without_safetensors(capsys, tmp_path):
    source = hf_dir(tmp_path, LLAMA, weights=False)
    (source / "pytorch_model.bin").write_bytes(b"")
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o")])
    assert "no *.safetensors" in err and "pytorch_model.bin" in err
    assert "safe_serialization=True" in err


def test_an_index_naming_a_missing_shard(capsys, tmp_path):
    source = hf_dir(tmp_path, LLAMA)
    (source / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o")])
    assert "model-00002-of-00002.safetensors" in err and "not there" in err


def test_no_config(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    err = refused(capsys, ["import-hf", "--hf-dir", str(tmp_path / "empty"),
                           "--save", str(tmp_path / "o")])
    assert "no config.json" in err and "never downloads" in err


def test_a_save_directory_that_is_not_empty(capsys, tmp_path):
    source = hf_dir(tmp_path, LLAMA)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(out)])
    assert f"--save {out} exists and is not empty" in err
    assert (out / "keep.txt").read_text() == "mine"


def test_no_megatron_checkout(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("MEGATRON_LM_PATH")
    err = imported(capsys, tmp_path, LLAMA)
    assert "set MEGATRON_LM_PATH" in err and "gpt_builders.py" in err


def test_a_bad_parallel_size(capsys, tmp_path):
    source = hf_dir(tmp_path, LLAMA)
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o"),
                           "--tensor-model-parallel-size", "0"])
    assert "'tp': 0" in err


def test_export_of_a_directory_that_is_no_checkpoint(capsys, tmp_path):
    (tmp_path / "ckpt").mkdir()
    err = refused(capsys, ["export-hf", "--load", str(tmp_path / "ckpt"),
                           "--hf-dir", str(tmp_path / "hf")])
    assert "latest_checkpointed_iteration.txt" in err and not (tmp_path / "hf").exists()


def test_export_with_a_config_of_another_model(capsys, tmp_path, monkeypatch):
    args = type("Args", (), dict(num_layers=2, hidden_size=16, num_attention_heads=2,
                                 padded_vocab_size=64))()
    monkeypatch.setattr(conversion, "checkpoint_args", lambda load: args)
    config = hf_dir(tmp_path, LLAMA, weights=False, name="config")  # 1 layer, not 2
    err = refused(capsys, ["export-hf", "--load", str(tmp_path), "--hf-dir",
                           str(tmp_path / "hf"), "--hf-config", str(config)])
    assert "'num_hidden_layers': (1, 2)" in err and "--hf-config" in err
    assert not (tmp_path / "hf").exists()


def test_vocab_divisor_gives_the_checkpoints_rows():
    # Megatron pads size up to a multiple of divisor * tp; the result must be the HF rows
    for rows, size, tp in [(512, 512, 1), (512, 500, 2), (512, 305, 2), (151936, 151665, 2), (128256, 128256, 8),
                           (32000, 32000, 2)]:
        divisor = conversion.vocab_divisor(rows, size, tp)
        for ways in (1, tp):  # the import fills at TP1, the checkpoint is trained at tp
            multiple = divisor * ways
            assert -(-size // multiple) * multiple == rows, (rows, size, tp, divisor)


@pytest.mark.parametrize("flag, size, says", [
    ("--tensor-model-parallel-size", "4", "num_attention_heads (2)"),
    ("--pipeline-model-parallel-size", "2", "num_hidden_layers (1)"),
    ("--expert-model-parallel-size", "2", "has no experts"),
])
def test_a_layout_that_does_not_split_the_model(capsys, tmp_path, flag, size, says):
    source = hf_dir(tmp_path, LLAMA)
    err = refused(capsys, ["import-hf", "--hf-dir", str(source), "--save", str(tmp_path / "o"),
                           flag, size])
    assert says in err and flag in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("rows, tp", [(512, 1), (512, 2), (32000, 8), (151936, 4), (50257, 1)])
def test_null_tokenizer_vocabulary_is_the_rows_on_every_release(rows, tp):
    # NullTokenizer --vocab-size rows-1 is rows tokens up to 0.18 and rows-1 from 0.19
    divisor = conversion.vocab_divisor(rows, rows - 1, tp)
    for size in (rows - 1, rows):
        assert -(-size // (divisor * tp)) * divisor * tp == rows, (rows, tp, size)
    flags = conversion._export_vocabulary(rows * 2, 2)  # export: the padded rows at the step's TP
    size_flag, divisor = int(flags[3]), int(flags[5])
    for size in (size_flag, size_flag + 1):
        assert -(-size // (divisor * 2)) * divisor * 2 == rows * 2


DEEPSEEK = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
            "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 2, "n_routed_experts": 4, "n_shared_experts": 1,
            "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
            "q_lora_rank": 8, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
            "v_head_dim": 8, "hidden_act": "silu", "max_position_embeddings": 32,
            "rms_norm_eps": 1e-6, "rope_interleave": True, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
        "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}
DEEPSEEK_V2 = {**{k: v for k, v in DEEPSEEK.items() if k not in ("rope_interleave",
                                                                 "num_nextn_predict_layers")},
               "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
               "q_lora_rank": None, "n_group": None, "topk_group": None, "norm_topk_prob": False,
               "topk_method": "greedy", "routed_scaling_factor": 1.0, "aux_loss_alpha": 0.001,
               "seq_aux": True, "rope_parameters": {**YARN, "mscale": 0.707,
                                                    "mscale_all_dim": 0.707}}


@pytest.mark.parametrize("change, says", [
    ({"rope_parameters": {**YARN, "original_max_position_embeddings": 8192}},
     "YaRN original_max_position_embeddings=8192: Megatron's MLA fixes it at 4096"),
    ({"rope_parameters": {**YARN, "beta_fast": 16}}, "YaRN beta_fast=16"),
    ({"rope_parameters": {**YARN, "mscale": None}}, "mscale_all_dim=1.0 without mscale"),
    ({"rope_parameters": {**YARN, "attention_factor": 1.2}}, "attention_factor=1.2"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
     "rope_type 'llama3' for deepseek_v3"),
    ({"num_experts_per_tok": 4}, "top num_experts_per_tok/topk_group (4)"),
    ({"rope_interleave": False}, "rope_interleave=False"),
])
def test_deepseek_what_megatron_would_compute_otherwise(capsys, tmp_path, change, says):
    err = imported(capsys, tmp_path, {**DEEPSEEK, **change})
    assert says in err, err


@pytest.mark.parametrize("change, says", [
    ({"topk_method": "noaux_tc"}, "topk_method='noaux_tc'"),
    ({"norm_topk_prob": True}, "norm_topk_prob=True"),
    ({"scoring_func": "sigmoid"}, "scoring_func='sigmoid'"),
    ({"rope_interleave": True}, "does not know: rope_interleave"),  # V3's; V2 has no switch
])
def test_deepseek_v2_what_megatron_would_compute_otherwise(capsys, tmp_path, change, says):
    err = imported(capsys, tmp_path, {**DEEPSEEK_V2, **change})
    assert says in err and "nothing was written" in err.lower(), err


def test_deepseek_flags_follow_the_config():
    """V2-Lite (no query LoRA, softmax top-k unnormalised, YaRN with V2's mscales) and V3 (query
    LoRA, sigmoid + expert bias, YaRN) give the Megatron flags that build them."""
    def flag(flags, name):
        return flags[flags.index(name) + 1] if name in flags else None

    v2 = _flags(DEEPSEEK_V2)
    assert "--q-lora-rank" not in v2 and "--moe-router-enable-expert-bias" not in v2
    assert flag(v2, "--moe-router-score-function") == "softmax" and "--moe-router-pre-softmax" in v2
    assert flag(v2, "--moe-router-load-balancing-type") == "seq_aux_loss"
    assert flag(v2, "--moe-aux-loss-coeff") == "0.001"
    assert (flag(v2, "--rope-type"), flag(v2, "--rotary-scaling-factor"), flag(v2, "--mscale"),
            flag(v2, "--mscale-all-dim")) == ("yarn", "40", "0.707", "0.707")
    v3 = _flags({**DEEPSEEK, "rope_parameters": YARN})
    assert flag(v3, "--q-lora-rank") == "8" and "--moe-router-enable-expert-bias" in v3
    assert flag(v3, "--moe-router-score-function") == "sigmoid"
    assert "--moe-router-pre-softmax" not in v3
    assert (flag(v3, "--mscale"), flag(v3, "--mscale-all-dim")) == ("1.0", "1.0")
    # YaRN without both mscales: transformers scales cos/sin by the factor's mscale alone
    plain = _flags({**DEEPSEEK, "rope_parameters": {**YARN, "mscale": None,
                                                            "mscale_all_dim": None}})
    assert (flag(plain, "--mscale"), flag(plain, "--mscale-all-dim")) == ("1.0", "0.0")
    assert flag(_flags(DEEPSEEK), "--rope-type") == "rope"


def test_deepseek_v2_group_limited_routing_is_the_best_expert_rule():
    """The full DeepSeek-V2's group_limited_greedy routes with the layer's --moe-router-group-score
    max; V2-Lite's greedy top-k has no groups, whatever n_group says; the export says
    group_limited_greedy back, and refuses megatron-core's own group rule on softmax scores
    (V2's config cannot say it)."""
    from types import SimpleNamespace

    from megatron_musa_patch.checkpoint.errors import ConversionError
    from megatron_musa_patch.checkpoint.families import deepseek

    def flag(flags, name):
        return flags[flags.index(name) + 1] if name in flags else None

    full = {**DEEPSEEK_V2, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1}
    families.family_of(full).check(full)
    flags = _flags(full)
    assert (flag(flags, "--moe-router-num-groups"), flag(flags, "--moe-router-group-topk"),
            flag(flags, "--moe-router-group-score")) == ("2", "1", "max")
    greedy = _flags({**DEEPSEEK_V2, "topk_method": "greedy", "n_group": 2,
                             "topk_group": 1})
    assert "--moe-router-num-groups" not in greedy and "--moe-router-group-score" not in greedy

    def args(**kw):
        base = dict(
            moe_layer_freq=[0, 1], num_layers=2, moe_shared_expert_intermediate_size=None,
            moe_router_score_function="softmax", moe_router_pre_softmax=True, hidden_size=16,
            ffn_hidden_size=32, moe_ffn_hidden_size=8, num_attention_heads=2, num_experts=4,
            moe_router_topk=2, moe_router_topk_scaling_factor=None, moe_router_num_groups=2,
            moe_router_group_topk=1, moe_router_group_score="max", q_lora_rank=8,
            kv_lora_rank=8, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8,
            max_position_embeddings=64, layernorm_epsilon=1e-6,
            untie_embeddings_and_output_weights=True, attention_dropout=0.0,
            mtp_num_layers=None, rotary_base=10000, rope_type="rope",
            moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0)
        return SimpleNamespace(**{**base, **kw})

    config = deepseek.V2.config_from_args(args(), {"vocab_size": 128})
    assert (config["topk_method"], config["n_group"], config["topk_group"]) == \
        ("group_limited_greedy", 2, 1)
    assert deepseek.V2.config_from_args(args(moe_router_num_groups=None, moe_router_group_topk=None,
                                          moe_router_group_score="topk-sum"),
                                     {"vocab_size": 128})["topk_method"] == "greedy"
    with pytest.raises(ConversionError, match="without --moe-router-group-score max"):
        deepseek.V2.config_from_args(args(moe_router_group_score="topk-sum"), {"vocab_size": 128})


def test_deepseek_without_a_query_lora_is_built_without_a_query_norm():
    """V2-Lite (no query LoRA) gets --mla-q-proj-without-norm, V3 (a LoRA) does not; a checkpoint
    of such a model saved without the flag is refused for export on megatron-core 0.19, whose
    MLA then has a query norm the config cannot hold, and taken on 0.16-0.18 or with the flag."""
    from types import SimpleNamespace

    from packaging.version import Version

    from megatron_musa_patch.checkpoint.errors import ConversionError
    from megatron_musa_patch.checkpoint.families import deepseek

    assert "--mla-q-proj-without-norm" in _flags(DEEPSEEK_V2)
    assert "--mla-q-proj-without-norm" not in _flags({**DEEPSEEK, "rope_parameters": YARN})

    def args(**kw):
        return SimpleNamespace(**{"multi_latent_attention": True, "q_lora_rank": None,
                                  "qk_layernorm": True, "mla_q_proj_without_norm": False, **kw})

    with pytest.raises(ConversionError, match="saved without --mla-q-proj-without-norm: "
                                              "megatron-core 0.19.2 normalises") as refused:
        deepseek.V2.check_built_alike(args(), Version("0.19.2"))
    assert "written by a release before 0.19 with that release" in str(refused.value)
    for fine, release in ((args(), "0.18.2"), (args(mla_q_proj_without_norm=True), "0.19.2"),
                          (args(q_lora_rank=8), "0.19.2"), (args(qk_layernorm=False), "0.19.2")):
        deepseek.V2.check_built_alike(fine, Version(release))


def test_hub_bookkeeping_of_deepseek_configs_is_not_refused():
    """The released DeepSeek configs name their remote-code classes (auto_map): bookkeeping,
    not network; the old-style rope_scaling spelling of YaRN reads as rope_parameters."""
    auto_map = {"AutoConfig": "configuration_deepseek.DeepseekV2Config",
                "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"}
    old_style = {k: v for k, v in DEEPSEEK_V2.items() if k != "rope_parameters"}
    rope = {k: v for k, v in DEEPSEEK_V2["rope_parameters"].items() if k not in ("rope_type",
                                                                              "rope_theta")}
    config = {**old_style, "auto_map": auto_map, "rope_theta": 10000,
              "rope_scaling": {**rope, "type": "yarn"}}
    families.family_of(config).check(config)
    flags = _flags(config)
    assert flags[flags.index("--rope-type") + 1] == "yarn"
    assert flags[flags.index("--mscale-all-dim") + 1] == "0.707"


@pytest.mark.parametrize("quantization, says", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'quant_method': 'bitsandbytes'"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "'fmt': 'e5m2'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "weight_block_size [rows, columns]"),
])
def test_a_quantization_other_than_block_fp8(capsys, tmp_path, quantization, says):
    err = imported(capsys, tmp_path, {**LLAMA, "quantization_config": quantization})
    assert says in err and "Dequantize the model first" in err and "Nothing was written" in err


def test_block_fp8_is_read_dequantized_and_a_wrong_scale_grid_refused(tmp_path):
    """A float8 weight times its block's scale (partial blocks at the edges), in the config's
    dtype; the scales are part of their weights, the config that of the dequantized model."""
    from safetensors.torch import save_file

    from megatron_musa_patch.checkpoint.errors import ConversionError
    from megatron_musa_patch.checkpoint.hf import HFCheckpoint

    weight = torch.tensor([[1.0, -2.0, 0.5], [4.0, 0.25, -1.0], [0.5, 1.5, 2.0]])
    scale = torch.tensor([[0.5, 2.0], [4.0, 0.125]])  # blocks of 2 x 2: the last row/column
    path = hf_dir(tmp_path, {**LLAMA, "dtype": "bfloat16", "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [2, 2]}}, weights=False)
    name = "model.layers.0.mlp.down_proj.weight"
    save_file({name: weight.to(torch.float8_e4m3fn), name + "_scale_inv": scale,
               "model.norm.weight": torch.ones(3)}, str(path / "model.safetensors"))
    source = HFCheckpoint(path)
    assert "quantization_config" not in source.config
    assert source.names() == ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    got = source.get(name)
    want = torch.tensor([[0.5, -1.0, 1.0], [2.0, 0.125, -2.0], [2.0, 6.0, 0.25]])
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))
    assert torch.equal(source.get("model.norm.weight"), torch.ones(3))  # not quantized
    # a config that names no dtype: float32, the dtype the import's flags build then
    config = json.loads((path / "config.json").read_text())
    del config["dtype"]
    (path / "config.json").write_text(json.dumps(config))
    assert HFCheckpoint(path).get(name).dtype == torch.float32
    assert conversion._dtype_flags(config) == []
    save_file({name: weight.to(torch.float8_e4m3fn), name + "_scale_inv": scale[:1]},
              str(path / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"_scale_inv has shape \(1, 2\), where .* needs "
                                              r"\(2, 2\)"):
        HFCheckpoint(path).get(name)
    save_file({name: weight.to(torch.float8_e4m3fn)}, str(path / "model.safetensors"))
    with pytest.raises(ConversionError, match="float8_e4m3fn without .*down_proj.weight_scale_inv"):
        HFCheckpoint(path).get(name)
