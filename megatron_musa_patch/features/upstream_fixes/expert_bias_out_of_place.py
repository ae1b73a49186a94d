"""MoE experts with biases (no ``--disable-bias-linear``, ``SequentialMLP``): ``MLP.forward``
adds the probability-scaled fc2 bias *in place* to the fc2 output, which is the tensor the
tensor-parallel reduction's autograd function returned as-is (at any TP size); autograd refuses
("Output 0 of _ReduceFromModelParallelRegion is a view and is being modified inplace"). The bias
is added out of place instead: the same sum, one new tensor."""

from __future__ import annotations

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "MoE experts with biases: the scaled fc2 bias is added out of place")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", "megatron.core.transformer.mlp:MLP.forward", "wrap", _forward,
        why="MoE experts with biases: the scaled fc2 bias is added out of place (upstream's "
            "in-place add on the TP reduction's output fails in autograd)"))


def _forward(wrapped, instance, args, kwargs):
    """Upstream's MLP.forward with fc2's separate bias held back from it (so its in-place add is
    skipped) and added out of place to the result, scaled per token as upstream does."""
    per_token_scale = call_arguments(wrapped, args, kwargs).get("per_token_scale")
    fc2 = getattr(instance, "linear_fc2", None)
    if per_token_scale is None or fc2 is None or "forward" in vars(fc2):
        return wrapped(*args, **kwargs)
    held = []
    forward = fc2.forward

    def forward_holding_bias(*fc2_args, **fc2_kwargs):
        output, bias = forward(*fc2_args, **fc2_kwargs)
        held.append(bias)
        return output, None

    fc2.forward = forward_holding_bias  # this call only: the instance attribute is removed below
    try:
        output, output_bias = wrapped(*args, **kwargs)
    finally:
        del fc2.forward
    bias = held[-1] if held else None
    if bias is not None:
        output = output + bias.unsqueeze(0) * per_token_scale.unsqueeze(-1)
    return output, output_bias
