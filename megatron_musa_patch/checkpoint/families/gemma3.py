"""Gemma 3 (text): refused, each piece Megatron's local spec lacks named. Its layers compute what
no flag of stock ``pretrain_gpt.py`` builds, so a conversion would load weights into a network
that computes something else."""

from __future__ import annotations

MISSING = (
    "GeGLU with the tanh-approximated GELU (hidden_activation gelu_pytorch_tanh; the local "
    "spec's gated MLP is SwiGLU)",
    "RMSNorm scaling by 1 + weight (Gemma's zero-centred norms; Megatron's RMSNorm scales by "
    "the weight)",
    "a norm after the attention and after the MLP as well as before them (the local layer has "
    "the pre-norms only)",
    "the embedding scaled by the square root of the hidden size",
    "sliding-window attention on five layers of six, with their own RoPE base "
    "(rope_local_base_freq)",
    "the attention's softmax scale from query_pre_attn_scalar rather than the head size",
)

REFUSED = {
    architecture: (
        f"{architecture} (Gemma 3) is not converted: Megatron's local layers lack "
        + "; ".join(MISSING) + ". Nothing was written.")
    for architecture in ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
}
