"""Tiny Hugging Face models of each family, random weights, made locally with transformers
(nothing is downloaded): the conversion tests' inputs."""

from pathlib import Path

#: family -> (config class, model class, config fields beyond the shared tiny shape)
#: initializer_range 0.1, not transformers' 0.02: at 0.02 a tiny model's attention and routing
#: are so flat that its loss barely depends on them (a wrong YaRN mscale moved it by 8e-8
#: relative, under the tests' 1e-5; at 0.1 by 4e-4)
SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.1)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama31": ("LlamaConfig", "LlamaForCausalLM", {
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4,
                                                         "num_experts_per_tok": 2}),
    # MLA with a query LoRA, one dense layer then MoE layers with a shared expert, grouped
    # top-4 of 8 sigmoid-scored experts with a bias; YaRN as the released V3 has it
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "first_k_dense_replace": 1,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "moe_intermediate_size": 32,
        "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 0,
        "max_position_embeddings": 163840, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
            "beta_slow": 1, "original_max_position_embeddings": 4096, "mscale": 1.0,
            "mscale_all_dim": 1.0}}),
    # DeepSeek-V2-Lite's shape: MLA without a query LoRA, greedy top-3 of 8 softmax-scored
    # experts unnormalised beside two shared ones, V2's YaRN mscales; the hub config's routing
    # fields that transformers does not hold (aux_loss_alpha, seq_aux, scoring_func) kept
    "deepseek_v2_lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "first_k_dense_replace": 1,
        "q_lora_rank": None, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 2,
        "num_experts_per_tok": 3, "moe_intermediate_size": 32, "topk_method": "greedy",
        "routed_scaling_factor": 1.0, "aux_loss_alpha": 0.001, "seq_aux": True,
        "scoring_func": "softmax", "max_position_embeddings": 163840, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
            "beta_slow": 1, "original_max_position_embeddings": 4096, "mscale": 0.707,
            "mscale_all_dim": 0.707}}),
    # the full DeepSeek-V2's routing: MLA with a query LoRA, group_limited_greedy (the top group
    # by its best expert; Megatron's own rule, the sum of a group's top 2, would choose other
    # groups), scaled unnormalised softmax weights
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "first_k_dense_replace": 1,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 2,
        "num_experts_per_tok": 2, "n_group": 4, "topk_group": 1, "moe_intermediate_size": 32,
        "topk_method": "group_limited_greedy", "routed_scaling_factor": 2.0,
        "aux_loss_alpha": 0.001, "seq_aux": True, "scoring_func": "softmax",
        "max_position_embeddings": 163840, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
            "beta_slow": 1, "original_max_position_embeddings": 4096, "mscale": 0.707,
            "mscale_all_dim": 0.707}}),
    # Qwen3-30B-A3B's kind of layer: q/k norms, normalised top-k of softmax-scored experts, no
    # shared expert (the hub spells the count num_experts)
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "norm_topk_prob": True}),
    # Qwen1.5-MoE's: Q/K/V biases, unnormalised top-k, a shared expert behind a sigmoid gate;
    # the first layer dense (mlp_only_layers), as Megatron's --moe-layer-freq says
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "norm_topk_prob": False, "mlp_only_layers": [0]}),
    # Phi-4's kind: fused qkv_proj and gate_up_proj, GQA
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    # partial RoPE (three quarters of each head, as Phi-4-mini, here without its LongRoPE), tied
    # embeddings
    "phi4_mini": ("Phi3Config", "Phi3ForCausalLM", {
        "pad_token_id": 0, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.75}}),
    # Moonlight's: DeepSeek-V3 under its own hub fields, one expert group, default RoPE
    "moonlight": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "first_k_dense_replace": 1,
        "q_lora_rank": None, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
        "n_group": 1, "topk_group": 1, "moe_intermediate_size": 32, "routed_scaling_factor": 2.4,
        "num_nextn_predict_layers": 0, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "aux_loss_alpha": 0.001, "seq_aux": True, "ep_size": 1, "moe_layer_freq": 1}),
}

#: model types transformers has no class for, made as the architecture they are and read by
#: transformers as that (``reference``): name -> (made as, model_type written, transformers')
RENAMED = {"kimi_k2": ("moonlight", "kimi_k2", "deepseek_v3")}


def reference(hf_dir: Path) -> Path:
    """The directory transformers reads for ``hf_dir``: itself, or, for a model type it has no
    class for (Kimi-K2's), a copy that names the architecture's own type."""
    import json

    config = json.loads((hf_dir / "config.json").read_text())
    for made_as, model_type, theirs in RENAMED.values():
        if config["model_type"] == model_type:
            twin = hf_dir.parent / (hf_dir.name + ".transformers")
            if not twin.exists():
                twin.mkdir()
                for file in hf_dir.iterdir():
                    (twin / file.name).symlink_to(file.resolve())
                (twin / "config.json").unlink()
                (twin / "config.json").write_text(json.dumps({**config, "model_type": theirs}))
            return twin
    return hf_dir


def make(family: str, root: Path, seed: int = 0, dtype: str = "float32", **overrides) -> Path:
    """A saved tiny model of ``family`` under ``root``; returns its directory."""
    import torch
    import transformers

    if family == "deepseek_v3_fp8":
        return with_fp8(make("deepseek_v3", root, seed, dtype, **overrides))
    if family == "deepseek_v3_mtp":
        # 4 layers, so that PP2 splits them
        return with_mtp(make("deepseek_v3", root, seed, dtype,
                             **{"num_hidden_layers": 4, **overrides}), seed)

    if family in RENAMED:
        import json

        made_as, model_type, _ = RENAMED[family]
        made = make(made_as, root, seed, dtype, **overrides)
        config = json.loads((made / "config.json").read_text())
        config.update(model_type=model_type, auto_map={
            "AutoConfig": "configuration_deepseek.DeepseekV3Config",
            "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"})
        (made / "config.json").write_text(json.dumps(config, indent=2))
        return made.rename(root / family)

    config_class, model_class, extra = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**SHAPE, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).to(getattr(torch, dtype))
    with torch.no_grad():  # norms and biases away from their init values, so mistakes show
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
        for name, buffer in model.named_buffers():  # DeepSeek-V3's routing bias starts at zero
            if name.endswith("e_score_correction_bias"):
                buffer.add_(torch.randn_like(buffer) * 0.1)
    target = root / family
    model.save_pretrained(target)
    if family in WITH_TOKENIZER:
        tokenizer(config.vocab_size - 200).save_pretrained(target)
    return target


#: families whose tiny model comes with a tokenizer (smaller than the model's vocabulary, as
#: released models' often are), so import-hf takes the HuggingFaceTokenizer path
WITH_TOKENIZER = {"qwen3"}


def tokenizer(size: int):
    """A byte-level BPE of ``size`` tokens trained here on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = ["Hugging Face checkpoints in and out of Megatron, one tensor at a time."] * 50
    bpe.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def hf_loss(hf_dir: Path, input_ids, labels) -> float:
    """transformers' mean token loss of ``labels`` given ``input_ids`` (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float()
    return float(torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))


def with_mtp(model_dir: Path, seed: int) -> Path:
    """The DeepSeek-V3 model with one MTP layer as a hub checkpoint stores it (transformers
    builds none): layer num_hidden_layers, a MoE decoder layer with enorm, hnorm, eh_proj and
    shared_head.norm, and copies of the embedding and output head."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((model_dir / "config.json").read_text())
    last, mtp = config["num_hidden_layers"] - 1, config["num_hidden_layers"]
    weights = load_file(str(model_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed + 1)

    def noise(like, scale=0.02):
        return torch.randn(like.shape, generator=generator, dtype=like.dtype) * scale

    for name, tensor in list(weights.items()):
        if name.startswith(f"model.layers.{last}."):
            weights[name.replace(f".{last}.", f".{mtp}.", 1)] = tensor + noise(tensor)
    hidden = config["hidden_size"]
    one = torch.ones(hidden)
    prefix = f"model.layers.{mtp}."
    weights.update({
        prefix + "enorm.weight": one + noise(one, 0.1), prefix + "hnorm.weight": one + noise(one, 0.1),
        prefix + "shared_head.norm.weight": one + noise(one, 0.1),
        prefix + "eh_proj.weight": noise(torch.empty(hidden, 2 * hidden), 0.05),
        prefix + "embed_tokens.weight": weights["model.embed_tokens.weight"].clone(),
        prefix + "shared_head.head.weight": weights["lm_head.weight"].clone()})
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    config["num_nextn_predict_layers"] = 1
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir


#: the block of the tiny FP8 model: its sides do not divide every weight (kv_a_proj_with_mqa has
#: 24 rows), so partial blocks are read as the hub's 128 x 128 ones are
FP8_BLOCK = (16, 16)


def with_fp8(model_dir: Path) -> Path:
    """The model as the DeepSeek-V3 hub stores it: every linear weight of the decoder layers
    (attention, dense MLP, experts, shared experts; not the router, norms, embedding or head) in
    float8 e4m3 with one float32 scale per block (``<name>_scale_inv``: the block's largest
    magnitude / 448), and the quantization_config that says so."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model_dir / "model.safetensors"))
    rows, cols = FP8_BLOCK
    linear = [n for n in weights if n.startswith("model.layers.") and n.endswith("_proj.weight")]
    for name in linear:
        w = weights[name].to(torch.float32)
        grid = (-(-w.shape[0] // rows), -(-w.shape[1] // cols))
        padded = torch.zeros(grid[0] * rows, grid[1] * cols)
        padded[:w.shape[0], :w.shape[1]] = w
        blocks = padded.reshape(grid[0], rows, grid[1], cols)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
        expanded = scale.repeat_interleave(rows, 0)[:w.shape[0]].repeat_interleave(cols, 1)[
            :, :w.shape[1]]
        weights[name] = (w / expanded).to(torch.float8_e4m3fn)
        weights[name + "_scale_inv"] = scale
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                     "quant_method": "fp8", "weight_block_size": list(FP8_BLOCK)}
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir
