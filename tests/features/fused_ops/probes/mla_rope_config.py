"""MLATransformerConfig with the default --rope-fusion off CUDA, through the activated layer:
built for rope_type "rope" and "yarn" with apply_rope_fusion turned off (upstream raised in
__post_init__ for "rope"); prints ``unfused MLA RoPE``.

Run by tests/features/fused_ops/test_flags.py."""

import megatron_musa_patch

from megatron.core.transformer.transformer_config import MLATransformerConfig


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    for rope_type in ("rope", "yarn"):
        config = MLATransformerConfig(
            num_layers=2, hidden_size=64, num_attention_heads=4, multi_latent_attention=True,
            q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8,
            v_head_dim=16, rope_type=rope_type, apply_rope_fusion=True)
        assert config.apply_rope_fusion is False, rope_type
    print("unfused MLA RoPE")


if __name__ == "__main__":
    main()
