"""Shared cases for tests/lib/ops/test_*.py: devices (GPU cases skip with the reason), dtypes,
tolerances, and gradients of an op against its torch reference."""

import pytest
import torch

GPU_SKIP = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
DEVICES = ["cpu", pytest.param("cuda", marks=GPU_SKIP)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: (atol, rtol) of an op against its fp32-computing reference, per input dtype
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def wave(y, fn=torch.cos):
    """A deterministic upstream gradient shaped like ``y``, in ``y``'s dtype."""
    return fn(torch.arange(y.numel(), device=y.device, dtype=torch.float32)).view_as(y).to(y.dtype)


def grads(fn, inputs, upstream):
    leaves = [t.detach().clone().requires_grad_(True) if t is not None and t.is_floating_point()
              else t for t in inputs]
    out = fn(*leaves)
    wrt = [t for t in leaves if t is not None and t.requires_grad]
    return out.detach(), torch.autograd.grad(out, wrt, upstream(out))


def assert_close(actual, expected, dtype, scale=1.0):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol * scale,
                               rtol=rtol * scale)
