"""Grouped GEMM for ``--moe-grouped-gemm`` without TransformerEngine or the ``grouped_gemm``
package.

``gmm(a, b, batch_sizes, trans_b=False)`` has the ``grouped_gemm.ops.gmm`` signature that
megatron-core's ``GroupedMLP`` calls: ``a`` [tokens, k] holds the experts' rows one expert after
the other (``batch_sizes[e]`` rows for expert ``e``, zero allowed), ``b`` is [experts, k, n]
(``trans_b``: [experts, n, k]); the result is [tokens, n].

Two implementations:

* ``grouped_mm``: torch's ``torch.nn.functional.grouped_mm`` (one call for all experts, and its
  own backward). It needs every non-unit stride to be a multiple of 16 bytes; other shapes use
  the loop.
* ``loop``: one matmul per expert (the reference).

Which one runs is chosen per device type from ``benchmarks/bench_attention.py``'s grouped-GEMM
table (``PREFERRED``); ``MEGATRON_MUSA_PATCH_GMM=loop|grouped_mm`` (the ops policy) overrides it.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.nn.functional as F

from . import policy

#: implementation per device type, by measurement (benchmarks/bench_attention.py, grouped GEMM
#: table in docs/benchmarks.md): on CPU grouped_mm gives the loop's numbers bit for bit and is
#: faster. CUDA: torch's kernel where the GPU and dtype have one (else the loop,
#: see _unsupported); not measured here. MUSA: no grouped_mm known in torch_musa: the loop.
PREFERRED: Dict[str, str] = {"cpu": "grouped_mm", "cuda": "grouped_mm", "musa": "loop"}

#: (device type, dtype) pairs whose grouped_mm forward raised: they use the loop from then on
_unsupported: set = set()


def _split(a: torch.Tensor, batch_sizes) -> list:
    return list(torch.split(a, [int(n) for n in batch_sizes.tolist()], dim=0))


def gmm_loop(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor,
             trans_b: bool = False) -> torch.Tensor:
    """One matmul per expert; experts without rows still give ``b`` a (zero) gradient."""
    weights = b.transpose(-1, -2) if trans_b else b
    pieces = [chunk @ weights[e] for e, chunk in enumerate(_split(a, batch_sizes))]
    return torch.cat(pieces, dim=0)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous (grouped_mm's backward
    rejects the broadcast gradients that e.g. ``.sum()`` produces)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _aligned(t: torch.Tensor) -> bool:
    return all(stride == 1 or (stride * t.element_size()) % 16 == 0 for stride in t.stride())


def grouped_mm_usable(a: torch.Tensor, b: torch.Tensor, trans_b: bool = False) -> bool:
    if not hasattr(F, "grouped_mm") or a.dtype != b.dtype or a.dim() != 2 or b.dim() != 3:
        return False
    weights = b.transpose(-1, -2) if trans_b else b
    n = weights.shape[-1]
    # grouped_mm's backward builds [k, n]/[n, k] operands: their rows must be aligned too
    return (_aligned(a) and _aligned(weights) and (a.shape[1] * a.element_size()) % 16 == 0
            and (n * a.element_size()) % 16 == 0)


def gmm_grouped_mm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor,
                   trans_b: bool = False) -> torch.Tensor:
    weights = b.transpose(-1, -2) if trans_b else b
    offsets = torch.cumsum(batch_sizes.to(device=a.device, dtype=torch.int64), 0).to(torch.int32)
    return _ContiguousGrad.apply(F.grouped_mm(a, weights, offs=offsets))


IMPLEMENTATIONS: Dict[str, Callable] = {"loop": gmm_loop, "grouped_mm": gmm_grouped_mm}


def choice(device_type: str) -> str:
    return policy.current().gmm or PREFERRED.get(device_type, "loop")


def _implementation(a: torch.Tensor, b: torch.Tensor, trans_b: bool) -> str:
    """The implementation ``gmm`` uses for these operands (before a failed kernel is known)."""
    name = choice(a.device.type)
    if name == "grouped_mm" and (a.shape[0] == 0 or (a.device.type, a.dtype) in _unsupported
                                 or not grouped_mm_usable(a, b, trans_b)):
        return "loop"
    return name


def gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor,
        trans_b: bool = False) -> torch.Tensor:
    """``grouped_gemm.ops.gmm``: the rows of expert ``e`` times ``b[e]`` (see the module doc)."""
    if b.shape[0] != batch_sizes.numel():
        raise ValueError(f"gmm: {b.shape[0]} weight matrices but {batch_sizes.numel()} batch sizes")
    name = _implementation(a, b, trans_b)
    key = (a.device.type, a.dtype)
    if name == "grouped_mm":
        try:
            return gmm_grouped_mm(a, b, batch_sizes, trans_b)
        except (RuntimeError, NotImplementedError):  # no kernel for this GPU / dtype
            _unsupported.add(key)
            name = "loop"
    return IMPLEMENTATIONS[name](a, b, batch_sizes, trans_b)


def gmm_backward(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor, trans_b: bool,
                 grad: torch.Tensor):
    """``(d a, d b)`` of ``gmm(a, b, batch_sizes, trans_b)`` for the output gradient ``grad``,
    without its forward: the operations autograd runs for the implementation ``gmm`` picks for
    these operands, in the same order, so the result is bit for bit autograd's
    (``tests/lib/ops/test_grouped_gemm.py``). ``--recompute-variance`` applies it to the grouped
    experts' last GEMM, whose forward it skips in the recompute."""
    weights = b.transpose(-1, -2) if trans_b else b
    if _implementation(a, b, trans_b) == "grouped_mm":
        offsets = torch.cumsum(batch_sizes.to(device=a.device, dtype=torch.int64),
                               0).to(torch.int32)
        grad = grad.contiguous()  # what _ContiguousGrad hands grouped_mm's backward
        grad_a = F.grouped_mm(grad, weights.transpose(-1, -2), offs=offsets)
        grad_w = F.grouped_mm(a.t(), grad, offs=offsets)
    else:  # the loop: torch.mm's backward per expert, then cat's and stack's
        sizes = [int(n) for n in batch_sizes.tolist()]
        pieces = list(zip(torch.split(a, sizes, dim=0), torch.split(grad, sizes, dim=0)))
        grad_a = torch.cat([_mm_input_grad(g, x, weights[e]) for e, (x, g) in enumerate(pieces)],
                           dim=0)
        grad_w = torch.stack([_mm_weight_grad(g, x, weights[e])
                              for e, (x, g) in enumerate(pieces)])
    return grad_a, (grad_w.transpose(-1, -2) if trans_b else grad_w)


def _column_major(t: torch.Tensor) -> bool:
    return t.stride(0) == 1 and t.stride(1) == t.shape[0]


def _mm_input_grad(grad, mat1, mat2):
    """d mat1 of ``mat1.mm(mat2)``, as torch's mm backward computes it (by mat1's layout)."""
    return mat2.mm(grad.t()).t() if _column_major(mat1) else grad.mm(mat2.t())


def _mm_weight_grad(grad, mat1, mat2):
    """d mat2 of ``mat1.mm(mat2)``, as torch's mm backward computes it (by mat2's layout)."""
    return grad.t().mm(mat1).t() if _column_major(mat2) else mat1.t().mm(grad)
