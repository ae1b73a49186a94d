"""Flags that need TransformerEngine, on a machine without it.

* ``--transformer-impl transformer_engine`` is upstream's default, so every script that does not
  say ``--transformer-impl local`` asks for it (MT-Megatron's scripts say it explicitly). Without
  TE, upstream dies while building the model (``NameError: name 'TESpecProvider' is not
  defined``, a traceback from every rank). Here the run stops at argument validation, before any
  model is built, with one paragraph naming ``--transformer-impl local`` and what the layer gives
  on it.
* ``--tp-comm-overlap`` overlaps tensor-parallel communication with GEMMs through TE's
  userbuffers; upstream stops in ``initialize`` without TE (and its argument check asks for
  sequence parallelism first). It changes no number, only speed: on the local spec it is dropped
  with one warning (rank 0), so MT-Megatron's training arguments run as they are.
"""

from __future__ import annotations

import sys

from megatron_musa_patch.upstream.conditions import te_installed
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "without TransformerEngine: --transformer-impl transformer_engine stops with one paragraph;"
    " --tp-comm-overlap is dropped with a warning",
    aliases=("te_absent",), kept_out=("device",))


def paragraph(device: str) -> str:
    return (
        f"--transformer-impl transformer_engine (upstream's default when the flag is not given) "
        f"needs TransformerEngine, which is not installed here; upstream would stop while "
        f"building the model (NameError: TESpecProvider). Add --transformer-impl local: "
        f"megatron-core's own layers, which this layer runs on {device} with upstream's fusion "
        f"defaults (fused RMSNorm/LayerNorm, RoPE, SwiGLU, masked softmax and gradient "
        f"accumulation from its own ops), --use-flash-attn through scaled_dot_product_attention, "
        f"--sequence-parallel on the local norms, --moe-grouped-gemm and --moe-permute-fusion, "
        f"multi-latent attention, the distributed and CPU-offload optimizers, and the "
        f"fine-grained recompute flags (--attn-recompute, --mlp-recompute, "
        f"--recompute-variance). FP8 (--fp8-format) needs TransformerEngine either way.")


@hookimpl(tryfirst=True)  # before other plugins' checks name flags that would not matter then
def mmp_validate_args(args, session, device):
    if te_installed() or session.why_unavailable(FEATURE.name) is not None:
        return
    if getattr(args, "transformer_impl", "local") == "transformer_engine":
        raise ArgumentError(paragraph(device.name))
    if getattr(args, "tp_comm_overlap", False):
        args.tp_comm_overlap = False
        if session.is_rank_zero():
            print("megatron_musa_patch: warning: --tp-comm-overlap overlaps tensor-parallel "
                  "communication with GEMMs through TransformerEngine's userbuffers, which are "
                  "not installed: the local layers run their communication without that overlap "
                  "(same numbers). Remove --tp-comm-overlap to silence this.", file=sys.stderr,
                  flush=True)
