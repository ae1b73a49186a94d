"""Device-dispatched ops behind megatron-core's fusion points.

Each module holds one op: a torch reference, the implementations per device, and which one is
chosen where (by measurement, see ``benchmarks/bench_ops.py``). Nothing here imports Megatron at
module import time; the ``features/`` plugins plug the ops into Megatron.

``norm`` (RMSNorm, LayerNorm), ``swiglu`` (bias + SwiGLU), ``rope`` (bshd/thd RoPE),
``softmax`` (scaled masked / causal softmax), ``grad_accum`` (weight gradient accumulated into
``main_grad``) are plugged in by ``features/fused_ops.py``; ``dispatch`` picks csrc kernels
(``kernels``) on GPUs that have them and holds ``MEGATRON_MUSA_PATCH_OPS`` (auto | eager |
compile | native) for comparisons.
"""
