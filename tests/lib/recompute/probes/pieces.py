"""The pieces of the recompute feature on small tensors, one CPU rank, each against plain
autograd: a block checkpoint, with its last linear's forward skipped (also with a frozen
weight), the zero placeholder a skipped linear returns, a last linear the feature cannot skip,
and the norm output released after the forward. Prints ``RESULT <json>``.

Run by tests/lib/recompute/test_pieces.py."""

import json
from types import SimpleNamespace

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch

from tests.features.recompute import recompute_layer
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import layers, random as tp_random
from megatron_musa_patch.base.errors import FeatureUnavailableError
from megatron_musa_patch.lib.recompute import blocks, deferred, wrappers
from megatron_musa_patch.lib.recompute.norm_output import NormOutput


def mlp_block():
    """An up-projection, and megatron-core's RowParallelLinear as the block's last linear."""
    cfg = ModelParallelConfig(use_cpu_initialization=True, gradient_accumulation_fusion=False)
    torch.manual_seed(0)
    up = torch.nn.Linear(16, 24)
    proj = layers.RowParallelLinear(24, 16, config=cfg, init_method=torch.nn.init.normal_,
                                    bias=True, input_is_parallel=True, skip_bias_add=True)

    def block(x):  # up-projection, activation, the last linear, bias + dropout + residual
        y, bias = proj(torch.nn.functional.gelu(up(x)))
        return x + torch.nn.functional.dropout(y + bias, p=0.3, training=True)

    return up, proj, block


def grads(up, proj, run, frozen=False):
    """The input's gradient, then those of the block's parameters that got one."""
    proj.weight.requires_grad_(not frozen)
    for p in [*up.parameters(), *proj.parameters()]:
        p.grad = None
    torch.manual_seed(1)
    x = torch.randn(6, 2, 16, requires_grad=True)
    y = run(x)
    (y * torch.arange(y.numel()).reshape(y.shape)).sum().backward()
    return [x.grad] + [p.grad for p in [*up.parameters(), *proj.parameters()]
                       if p.grad is not None]


def equal(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


def checkpoints(up, proj, block, out):
    plain = grads(up, proj, block)
    calls = []
    impl = deferred.forward_impl
    deferred.forward_impl = lambda a, k: calls.append(1) or impl(a, k)
    out["checkpoint"] = equal(plain, grads(
        up, proj, lambda x: blocks.checkpoint_block(block, (x,), {})))
    out["deferred"] = equal(plain, grads(
        up, proj, lambda x: blocks.checkpoint_block(block, (x,), {}, [proj])))
    out["deferred_calls"] = len(calls)
    out["frozen"] = equal(grads(up, proj, block, frozen=True), grads(
        up, proj, lambda x: blocks.checkpoint_block(block, (x,), {}, [proj]), frozen=True))


def placeholder(proj, out):
    proj.weight.requires_grad_(True)
    with blocks.deferring([proj]):
        y, _ = proj(torch.randn(6, 2, 24))
        out["placeholder_zeros"] = bool((y == 0).all()) and tuple(y.shape) == (6, 2, 16)
        out["placeholder_marked"] = getattr(y, blocks.MARK, False)
        out["reduce_passes_it"] = layers.reduce_from_tensor_model_parallel_region(y) is y


def foreign_linear():
    """A last linear that is not megatron-core's RowParallelLinear (e.g. TransformerEngine's)."""
    try:
        wrappers.last_linear(SimpleNamespace(linear_proj=torch.nn.Linear(2, 2)), "linear_proj")
        return "accepted"
    except FeatureUnavailableError as exc:
        return str(exc)


def norm_output(up, proj, norm, lin, out):
    """The norm output released after the forward, restored in backward: same gradients."""
    def normed(x, release):
        seen = []
        h = norm.register_forward_hook(lambda m, i, o: seen.append((i, o)))
        y = norm(x)
        h.remove()
        z = x + lin(y)
        if release:
            NormOutput.release(norm, *seen[0], until=z)
            out["released_bytes"] = y.untyped_storage().nbytes()
        return z

    base = grads(up, proj, lambda x: normed(x, False))
    out["norm_output"] = equal([*base], [*grads(up, proj, lambda x: normed(x, True))])


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    recompute_layer.init_single_rank()
    tp_random.model_parallel_cuda_manual_seed(7)
    up, proj, block = mlp_block()
    out = {}
    checkpoints(up, proj, block, out)
    placeholder(proj, out)
    # built before the foreign linear, as the random stream had them
    norm, lin = torch.nn.RMSNorm(16), torch.nn.Linear(16, 16)
    out["foreign_linear"] = foreign_linear()
    norm_output(up, proj, norm, lin, out)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
