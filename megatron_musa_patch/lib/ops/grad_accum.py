"""Gradient-accumulation fusion: the weight gradient ``grad_output^T @ input`` added straight
into ``main_grad`` (``main_grad += dY^T X``), as Apex's ``fused_weight_gradient_mlp_cuda``
``wgrad_gemm_accum_fp32`` / ``wgrad_gemm_accum_fp16`` do for megatron-core's
``LinearWithGradAccumulationAndAsyncCommunication``. No weight-sized temporary is made.

* Same dtype (fp32 activations into an fp32 ``main_grad``, or bf16 into bf16): one in-place
  ``main_grad.addmm_(dY^T, X)`` -- the GEMM accumulates into ``main_grad`` itself.
* bf16/fp16 activations into an fp32 ``main_grad`` (the usual mixed-precision case): CPU GEMMs
  cannot write a wider output type. Two strategies, neither makes an ``out x in`` temporary:
  ``fp32`` -- token chunks cast to fp32 and accumulated with ``addmm_`` (Apex's precision:
  fp32 throughout); ``rows`` -- blocks of output rows multiplied in the activation dtype and
  added (``main_grad[rows] += dY[:, rows]^T X``): the unfused path's numbers exactly (the
  gradient rounded to bf16 before the fp32 add), at the narrow GEMM's speed.

Measured (``benchmarks/bench_ops.py``; the figures are in docs/benchmarks.md, fused ops): bf16
-> fp32 ``rows`` is as fast as the unfused ``mm`` + ``add_`` (and bitwise equal to it), ``fp32``
several times slower -> the CPU uses ``rows``; other devices ``fp32`` (Apex's numbers). fp32:
``addmm_`` as fast as ``mm`` + ``add_``, without the weight-sized temporary.
"""

from __future__ import annotations

#: elements of the temporaries per chunk in the mixed-dtype paths
CHUNK_ELEMENTS = 1 << 22
#: mixed-dtype strategy per device type (measured, see the module docstring)
MIXED_CHOICE = {"cpu": "rows"}


def wgrad_accum_reference(total_input, grad_output, main_grad):
    main_grad += (grad_output.float().t() @ total_input.float()).to(main_grad.dtype)


def wgrad_accum(total_input, grad_output, main_grad, mixed: str = None):
    """``main_grad += grad_output^T @ total_input`` (both 2-D: tokens x features).

    ``mixed`` (activations narrower than ``main_grad``): ``"fp32"`` casts token chunks to fp32
    and accumulates in fp32 (Apex's precision); ``"rows"`` multiplies blocks of output rows in
    the activation dtype and adds each block (the unfused path's numbers, the device's fast
    narrow GEMM). Default: ``MIXED_CHOICE`` for the device type."""
    if total_input.dtype == main_grad.dtype and grad_output.dtype == main_grad.dtype:
        main_grad.addmm_(grad_output.t(), total_input)
        return
    mixed = mixed or MIXED_CHOICE.get(main_grad.device.type, "fp32")
    fan_out, fan_in = main_grad.shape
    if mixed == "rows":
        rows = max(1, CHUNK_ELEMENTS // max(1, fan_in))
        for start in range(0, fan_out, rows):
            stop = min(fan_out, start + rows)
            main_grad[start:stop] += grad_output[:, start:stop].t().matmul(total_input)
        return
    tokens = total_input.shape[0]
    rows = max(1, CHUNK_ELEMENTS // max(1, fan_out + fan_in))
    for start in range(0, tokens, rows):
        stop = min(tokens, start + rows)
        dy = grad_output[start:stop].to(main_grad.dtype)
        x = total_input[start:stop].to(main_grad.dtype)
        main_grad.addmm_(dy.t(), x)


def wgrad_gemm_accum_fp32(total_input, grad_output, main_grad):
    """Apex's ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32`` (fp32 ``main_grad``)."""
    wgrad_accum(total_input, grad_output, main_grad)


def wgrad_gemm_accum_fp16(total_input, grad_output, main_grad):
    """Apex's ``wgrad_gemm_accum_fp16`` (fp16/bf16 ``main_grad``)."""
    wgrad_accum(total_input, grad_output, main_grad)
