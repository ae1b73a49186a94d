"""Model FLOPs of one training iteration of a Megatron GPT, from Megatron's ``args``.

Counts the matrix multiplications of the model as it is built from the flags (the convention of
MFU: the model's FLOPs, not what the hardware re-does for activation recompute):

* attention: q/k/v projections with GQA (``--num-query-groups``) or MLA (``--q-lora-rank``,
  ``--kv-lora-rank``, ``--qk-head-dim``, ``--qk-pos-emb-head-dim``, ``--v-head-dim``), the
  output projection, ``--attention-output-gate``, and the core attention with a causal mask
  (each query attends to ``seq/2`` keys on average, QK^T and AV);
* MLP: dense (``--ffn-hidden-size``; SwiGLU has three matrices, a plain MLP two), MoE layers per
  ``--moe-layer-freq``: ``--moe-router-topk`` routed experts of ``--moe-ffn-hidden-size``, the
  shared experts (``--moe-shared-expert-intermediate-size``) and the router's own GEMM;
* MTP (``--mtp-num-layers``): per depth, the ``2h -> h`` projection, one transformer layer of the
  last decoder layer's kind (as ``gpt_builders`` builds it), and its own logits;
* the logits over the padded vocabulary.

A GEMM of ``m x k`` by ``k x n`` is ``2mkn`` FLOPs; training is 3x the forward (forward, input
gradient, weight gradient). Norms, softmax, activations and the embedding lookup are not
GEMMs and are not counted.

Against upstream's ``num_floating_point_operations`` (Megatron-LM core_v0.16.1 training.py) the
counts are the same for dense and GQA models. They differ where upstream counts something else:
upstream adds the RMSNorms inside MLA (``q_lora_rank + kv_lora_rank`` per token) and inside MTP
(``3h``) as if they were GEMM FLOPs and leaves out the MoE router's ``h x num_experts`` GEMM;
this count does the opposite. Upstream also overwrites ``args.num_query_groups`` when
``--group-query-attention`` is off; this count reads ``args`` only.
Not modelled (``UnsupportedModel``): hybrid/Mamba models and the experimental linear attention
variants; sliding-window attention is counted as full causal attention.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

#: forward + backward (input gradient) + backward (weight gradient)
TRAINING_FACTOR = 3


class UnsupportedModel(ValueError):
    """The model has parts this count does not model (the caller may fall back to upstream's)."""


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the FLOPs depend on, read from Megatron's ``args``."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    seq_length: int
    vocab_size: int  # padded, as the output layer is built
    swiglu: bool = False
    attention_output_gate: bool = False
    # MLA
    multi_latent_attention: bool = False
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    # MoE
    num_experts: Optional[int] = None
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    moe_layer_pattern: tuple = ()  # 1 = MoE layer, 0 = dense, one entry per decoder layer
    # MTP
    mtp_num_layers: int = 0

    @classmethod
    def from_args(cls, args) -> "ModelShape":
        get = lambda name, default=None: getattr(args, name, default)  # noqa: E731
        if get("is_hybrid_model"):
            raise UnsupportedModel("hybrid (Mamba) models")
        if get("experimental_attention_variant"):
            raise UnsupportedModel(
                f"--experimental-attention-variant {args.experimental_attention_variant}")
        layers, heads, hidden = args.num_layers, args.num_attention_heads, args.hidden_size
        groups = get("num_query_groups") if get("group_query_attention") else None
        vocab = get("padded_vocab_size") or get("vocab_size")
        if not vocab:
            raise UnsupportedModel("no vocabulary size yet (args.padded_vocab_size is unset)")
        num_experts = get("num_experts")
        pattern = moe_layer_pattern(get("moe_layer_freq", 1), layers) if num_experts else ()
        return cls(
            num_layers=layers,
            hidden_size=hidden,
            ffn_hidden_size=get("ffn_hidden_size") or 4 * hidden,
            num_attention_heads=heads,
            num_query_groups=groups or heads,
            kv_channels=get("kv_channels") or hidden // heads,
            seq_length=args.seq_length,
            vocab_size=vocab,
            swiglu=bool(get("swiglu")),
            attention_output_gate=bool(get("attention_output_gate")),
            multi_latent_attention=bool(get("multi_latent_attention")),
            q_lora_rank=get("q_lora_rank"),
            kv_lora_rank=get("kv_lora_rank") or 0,
            qk_head_dim=get("qk_head_dim") or 0,
            qk_pos_emb_head_dim=get("qk_pos_emb_head_dim") or 0,
            v_head_dim=get("v_head_dim") or 0,
            num_experts=num_experts,
            moe_router_topk=get("moe_router_topk") or 0,
            moe_ffn_hidden_size=get("moe_ffn_hidden_size") or get("ffn_hidden_size") or 4 * hidden,
            moe_shared_expert_intermediate_size=get("moe_shared_expert_intermediate_size") or 0,
            moe_layer_pattern=tuple(pattern),
            mtp_num_layers=get("mtp_num_layers") or 0,
        )


def moe_layer_pattern(freq, num_layers: int) -> List[int]:
    """``--moe-layer-freq`` as Megatron reads it: an int N puts an MoE layer at every N-th
    layer (starting with the first), a list gives one entry per layer."""
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(num_layers)]
    pattern = [int(x) for x in freq]
    if len(pattern) != num_layers:
        raise UnsupportedModel(f"--moe-layer-freq has {len(pattern)} entries for {num_layers} "
                               f"layers")
    return pattern


# --------------------------------------------------------------------------- per token, forward


def attention_flops(s: ModelShape) -> Dict[str, float]:
    """Forward FLOPs per token of one attention layer: projections and core attention."""
    h, n = s.hidden_size, s.num_attention_heads
    if s.multi_latent_attention:
        qk_dim = s.qk_head_dim + s.qk_pos_emb_head_dim
        if s.q_lora_rank:
            q_proj = 2 * h * s.q_lora_rank + 2 * s.q_lora_rank * n * qk_dim
        else:
            q_proj = 2 * h * n * qk_dim
        kv_down = 2 * h * (s.kv_lora_rank + s.qk_pos_emb_head_dim)  # latent + shared rope key
        kv_up = 2 * s.kv_lora_rank * n * (s.qk_head_dim + s.v_head_dim)
        projections = q_proj + kv_down + kv_up + 2 * n * s.v_head_dim * h
        v_dim = s.v_head_dim
    else:
        q_size = n * s.kv_channels
        kv_size = 2 * s.num_query_groups * s.kv_channels
        gate = q_size if s.attention_output_gate else 0
        projections = 2 * h * (q_size + kv_size + gate) + 2 * q_size * h
        qk_dim = v_dim = s.kv_channels
    keys = s.seq_length / 2  # causal: half of the score matrix
    core = 2 * n * qk_dim * keys + 2 * n * v_dim * keys  # QK^T, then scores x V
    return {"attention projections": projections, "core attention": core}


def mlp_flops(s: ModelShape, moe: bool) -> Dict[str, float]:
    """Forward FLOPs per token of one MLP (dense) or MoE layer."""
    matrices = 3 if s.swiglu else 2  # SwiGLU: gate and up (h -> 2 ffn), down
    h = s.hidden_size
    if not moe:
        return {"dense MLP": 2 * h * s.ffn_hidden_size * matrices}
    return {
        "MoE routed experts": 2 * h * s.moe_ffn_hidden_size * matrices * s.moe_router_topk,
        "MoE shared experts": 2 * h * s.moe_shared_expert_intermediate_size * matrices,
        "MoE router": 2 * h * s.num_experts,
    }


def forward_flops_per_token(s: ModelShape) -> Dict[str, float]:
    """Forward FLOPs per token by component, summed over the layers."""
    total: Dict[str, float] = {}

    def add(parts: Dict[str, float], times: float = 1):
        for key, value in parts.items():
            total[key] = total.get(key, 0) + value * times

    pattern = s.moe_layer_pattern or (0,) * s.num_layers
    add(attention_flops(s), s.num_layers)
    add(mlp_flops(s, moe=False), pattern.count(0))
    if s.num_experts:
        add(mlp_flops(s, moe=True), pattern.count(1))
    logits = 2 * s.hidden_size * s.vocab_size
    add({"logits": logits})
    if s.mtp_num_layers:
        # each depth: eh_proj (2h -> h), a layer like the last decoder layer, its own logits
        mtp = {"MTP projection": 2 * (2 * s.hidden_size) * s.hidden_size, "MTP logits": logits}
        mtp.update({f"MTP {k}": v for k, v in attention_flops(s).items()})
        mtp.update({f"MTP {k}": v for k, v in mlp_flops(s, moe=bool(pattern[-1])).items()})
        add(mtp, s.mtp_num_layers)
    return total


def training_flops(s: ModelShape, batch_size: int) -> Dict[str, float]:
    """Training FLOPs of one iteration of ``batch_size`` sequences, by component."""
    tokens = batch_size * s.seq_length
    return {k: TRAINING_FACTOR * v * tokens for k, v in forward_flops_per_token(s).items()}


def iteration_flops(args, batch_size: int) -> float:
    """Total training FLOPs of one iteration (all devices together)."""
    return sum(training_flops(ModelShape.from_args(args), batch_size).values())
