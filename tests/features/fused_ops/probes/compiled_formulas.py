"""Every compiled formula of lib/ops traced by dynamo as one graph, with no break, on the
activated CPU row (the device layer wraps torch factories and Tensor.to); prints ``one graph
each``, or fails naming the formula and its break reasons.

Run by tests/features/fused_ops/test_flags.py."""

import megatron_musa_patch
import torch

from megatron_musa_patch.lib.ops import softmax, norm, swiglu, rope


def cases():
    x = torch.randn(2, 3, 8, 8, dtype=torch.bfloat16)
    m = torch.ones(8, 8, dtype=torch.bool).triu(1)
    w, r, h = torch.ones(8), torch.ones(6, 1), x.reshape(-1, 8)[:6]
    return [(softmax._fwd, (x, m, 0.1)), (softmax._bwd, (x, x, 0.1)),
            (norm._rms_fwd, (h, w, 1e-5)),
            (norm._rms_bwd, (h, h, w, r)),
            (swiglu._fwd32, (x, None)), (swiglu._bwd32, (x[..., :4], x, None)),
            (rope._fwd, (x, x, x, False)), (rope._bwd, (x, x, x, True))]


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    for fn, args in cases():
        e = torch._dynamo.explain(fn)(*args)
        assert (e.graph_count, e.graph_break_count) == (1, 0), (fn.__name__, e.break_reasons)
    print("one graph each")


if __name__ == "__main__":
    main()
