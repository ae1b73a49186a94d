"""``--masked-softmax-fusion`` (default on; used for fp16/bf16 scores): stand-ins for
``scaled_masked_softmax_cuda``, ``scaled_upper_triang_masked_softmax_cuda`` and
``scaled_softmax_cuda`` (``ops.softmax``, the kernels' semantics). Upstream fails importing
them."""

from __future__ import annotations

from megatron_musa_patch.upstream.conditions import importable, missing
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from .spec import local_spec
from megatron_musa_patch.core.feature import feature


MODULES = ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda",
           "scaled_softmax_cuda")

FEATURE = feature(
    __name__,
    "--masked-softmax-fusion without Megatron's fused kernels (ops.softmax)",
    flag_needs=(FlagNeed(
        "--masked-softmax-fusion",
        when=lambda args: getattr(args, "masked_softmax_fusion", False)
        and (getattr(args, "fp16", False) or getattr(args, "bf16", False)) and local_spec(args)
        and not importable("scaled_masked_softmax_cuda"),
        because="on by default for fp16/bf16; upstream needs Megatron's scaled_masked_softmax_cuda",
        instead="add --no-masked-softmax-fusion"),))


@hookimpl
def mmp_register_patches(registry):
    for name in MODULES:
        registry.add(FEATURE.patch(
            name, f"{name}:*", "module", filler(name),
            condition=lambda n=name: missing(n),
            why="--masked-softmax-fusion: fused scale+mask+softmax in fp32 (ops.softmax)"))


def filler(name):
    """Fills the stand-in module ``name`` with ``ops.softmax`` under the kernel's convention."""
    def fill(module):
        from megatron_musa_patch.lib.ops import softmax

        def impl(x):
            return softmax.raw(softmax.softmax_impl(x.device.type, x.numel()))

        module.__doc__ = f"megatron_musa_patch stand-in for {name} (ops.softmax)"
        if name == "scaled_upper_triang_masked_softmax_cuda":
            module.forward = lambda x, scale: impl(x).causal(x, float(scale))
        elif name == "scaled_masked_softmax_cuda":
            module.forward = lambda x, mask, scale: impl(x).masked(x, mask, float(scale))
        else:
            module.forward = lambda x, scale: impl(x).masked(x, None, float(scale))
        module.backward = lambda dy, y, scale: impl(y).backward(dy, y, float(scale))
        # ops.softmax takes any shape: one batch per block divides every batch count
        module.get_batch_per_block = lambda sq, sk, b, np: 1

    return fill
