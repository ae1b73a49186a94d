"""Fine-grained recompute: ``--attn-recompute``, ``--mlp-recompute``, ``--recompute-variance``.

The feature plugin (``features/recompute.py``) adds the flags and the patch records; the logic
lives here, one job per module:

* ``rules``      -- which combinations are refused, for Megatron's ``args`` and for a
                    ``TransformerConfig`` alike (megatron-core-only users set the attributes).
* ``blocks``     -- checkpointing a block with Megatron's own ``tensor_parallel.checkpoint``;
                    in variance mode the recompute skips the block's last linear layer.
* ``deferred``   -- that skipped linear: Megatron's own backward, applied from the saved
                    output gradient to the recomputed input, without its forward.
* ``grouped``    -- the same for the grouped experts' fc2 GEMM (``GroupedMLP``).
* ``released``   -- tensors whose values are dropped after forward and recomputed in backward,
                    the graph untouched (``norm_output`` is the one-norm case).
* ``overlap``    -- ``--mlp-recompute`` on a shared expert overlapped with the token dispatch.
* ``rms``        -- MT-Megatron's RMSNorm variants (``--q-rms-recompute``,
                    ``--mlp-rms-recompute``; plugins ``recompute.mla_rms``/``recompute.mlp_rms``).
* ``wrappers``   -- the patches on ``TransformerLayer`` and the MoE experts, read at call time.
* ``accounting`` -- bytes held for backward (``saved_tensors_hooks``), for tests and benchmarks.

Nothing here imports Megatron at module import time except ``deferred`` (imported on first use).
"""
