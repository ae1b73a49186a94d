"""The grouped experts' last GEMM in the recompute of ``--recompute-variance``: no forward.

``GroupedMLP`` (``--moe-grouped-gemm`` on the local spec) runs every local expert's fc2 as one
grouped GEMM, ``gg.ops.gmm(intermediate, w2, tokens_per_expert)``, where ``w2`` is a view of its
``weight2`` and ``gg`` is the ``grouped_gemm_util`` module that ``experts.py`` imported. In a
variance recompute that GEMM only has to hand back its backward, as the per-expert
``linear_fc2`` does (``deferred``): :class:`GroupedGemmModule` stands in for ``gg`` inside
``experts.py``; its ``ops.gmm`` passes every call to the real ``gg.ops`` (read at call time, so
whoever fills it -- the grouped_gemm package or the layer's ``ops.grouped_gemm`` -- is served),
except a call on a deferred weight, which returns a zero placeholder whose backward is the
serving implementation's own ``gmm_backward`` (bit for bit what autograd would compute from the
re-run GEMM). The operations after fc2 (the token combine) do not read its values in backward.
"""

from __future__ import annotations

import importlib

import torch

from megatron_musa_patch.base.errors import FeatureUnavailableError
from .blocks import MARK, deferred_ids


class SkipForwardGmm(torch.autograd.Function):
    """``gmm(a, b, batch_sizes, trans_b)`` without the GEMM: zeros, and ``backward`` applied."""

    @staticmethod
    def forward(ctx, a, b, batch_sizes, trans_b, backward):
        ctx.save_for_backward(a, b)
        ctx.batch_sizes, ctx.trans_b, ctx.backward = batch_sizes, trans_b, backward
        columns = b.shape[-2] if trans_b else b.shape[-1]
        return a.new_zeros((a.shape[0], columns))

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a, grad_b = ctx.backward(a, b, ctx.batch_sizes, ctx.trans_b, grad)
        ctx.backward = None
        return grad_a, grad_b, None, None, None


def _is_deferred(weight: torch.Tensor) -> bool:
    ids = deferred_ids()
    base = weight._base if weight._base is not None else weight
    return bool(ids) and (id(weight) in ids or id(base) in ids)


class _DeferringOps:
    def __init__(self, owner):
        self._owner = owner

    def __getattr__(self, name):
        return getattr(self._owner.real.ops, name)

    def gmm(self, a, b, batch_sizes, trans_b=False):
        ops = self._owner.real.ops
        if not _is_deferred(b):
            return ops.gmm(a, b, batch_sizes, trans_b=trans_b)
        backward = getattr(ops, "gmm_backward", None)
        if backward is None:
            raise FeatureUnavailableError(
                "--recompute-variance with --mlp-recompute skips the grouped experts' fc2 GEMM "
                "in the recompute and applies its backward on its own, which the installed "
                "grouped_gemm package does not offer. Uninstall grouped_gemm (the layer's "
                "grouped GEMM then serves --moe-grouped-gemm), or drop --recompute-variance.")
        out = SkipForwardGmm.apply(a, b, batch_sizes, trans_b, backward)
        setattr(out, MARK, True)
        return out


class GroupedGemmModule:
    """Stands in for ``grouped_gemm_util`` inside ``megatron.core.transformer.moe.experts``:
    everything is the real module's, read when used; ``ops.gmm`` defers as described above."""

    def __init__(self, name: str = "megatron.core.transformer.moe.grouped_gemm_util"):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_ops", _DeferringOps(self))

    @property
    def real(self):
        return importlib.import_module(self._name)

    def __getattr__(self, name):
        return getattr(self.real, name)

    @property
    def ops(self):
        return self._ops if self.real.ops is not None else None
