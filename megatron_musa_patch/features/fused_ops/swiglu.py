"""``--bias-swiglu-fusion``: ``bias_swiglu_impl`` runs ``ops.swiglu`` on the CPU (measured faster
than upstream's eager function) and where ``ops.kernels`` has a SwiGLU kernel; elsewhere
upstream's ``@jit_fuser`` function (torch.compile on CUDA) runs unchanged. Upstream's works on
every device, so switching this fusion off needs no flag."""

from __future__ import annotations

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--bias-swiglu-fusion through ops.swiglu (CPU, csrc kernels)")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", "megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl", "wrap",
        bias_swiglu, rebind=("megatron.core.transformer.mlp",
                             "megatron.core.transformer.moe.shared_experts"),
        why="--bias-swiglu-fusion: ops.swiglu (measured faster than the eager function on CPU)"))


def bias_swiglu(wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    x, bias = call["input"], call["bias"]
    from megatron_musa_patch.lib.ops import swiglu

    impl = swiglu.swiglu_impl(x.device.type, x.numel())
    if call.get("fp8_input_store") or call.get("cpu_offload_input") or (
            impl != "kernel" and x.device.type != "cpu"):
        return wrapped(*args, **kwargs)  # upstream's @jit_fuser function (torch.compile on CUDA)
    return swiglu.bias_swiglu(x, bias, impl)
