"""The pieces of the recompute feature on small tensors: the argument plumbing of a block
checkpoint, the skipped-forward linear (Megatron's backward from the saved output gradient),
the all-reduce pass-through and the released-and-recomputed norm output -- each bitwise equal
to plain autograd."""

import json

import pytest
import torch

from megatron_musa_patch.lib.recompute import blocks

from tests.conftest import run_python, subprocess_env


def test_tensor_arguments_travel_and_the_rest_is_rebuilt():
    a, b, c = torch.ones(1), torch.zeros(2), torch.full((3,), 2.0)
    args, kwargs = (a, "x", (b, None, 3)), {"mask": c, "opt": None, "pair": [a, 7]}
    tensors, slots = blocks._split(args, kwargs)
    assert [t is x for t, x in zip(tensors, (a, b, c, a))] == [True] * 4
    skeleton = blocks._rebuild(args, kwargs, slots, [None] * len(slots))
    assert skeleton == ([None, "x", (None, None, 3)], {"mask": None, "opt": None,
                                                       "pair": [None, 7]})
    new = [t + 1 for t in tensors]
    rargs, rkwargs = blocks._rebuild(*skeleton, slots, new)
    assert rargs[0] is new[0] and rargs[2][0] is new[1] and rkwargs["mask"] is new[2]
    assert isinstance(rargs[2], tuple) and rkwargs["pair"][1] == 7


def test_deferral_is_scoped_to_the_thread_and_the_block():
    m1, m2 = object(), object()
    assert blocks.deferred_ids() == frozenset()
    with blocks.deferring([m1]):
        with blocks.deferring([m2]):
            assert blocks.deferred_ids() == {id(m1), id(m2)}
        assert blocks.deferred_ids() == {id(m1)}
    assert blocks.deferred_ids() == frozenset()


SCRIPT = r'''
import json, sys
import megatron_musa_patch
import torch
sys.path.insert(0, ".")
from tests.features.recompute.recompute_layer import init_single_rank
init_single_rank()
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import layers, random as tp_random
from megatron_musa_patch.lib.recompute import blocks, deferred
from megatron_musa_patch.lib.recompute.norm_output import NormOutput

tp_random.model_parallel_cuda_manual_seed(7)
cfg = ModelParallelConfig(use_cpu_initialization=True, gradient_accumulation_fusion=False)
torch.manual_seed(0)
up = torch.nn.Linear(16, 24)
proj = layers.RowParallelLinear(24, 16, config=cfg, init_method=torch.nn.init.normal_,
                                bias=True, input_is_parallel=True, skip_bias_add=True)
out = {}

def block(x):  # up-projection, activation, the last linear, bias + dropout + residual
    y, bias = proj(torch.nn.functional.gelu(up(x)))
    return x + torch.nn.functional.dropout(y + bias, p=0.3, training=True)

def grads(run, frozen=False):
    proj.weight.requires_grad_(not frozen)
    for p in [*up.parameters(), *proj.parameters()]:
        p.grad = None
    torch.manual_seed(1)
    x = torch.randn(6, 2, 16, requires_grad=True)
    y = run(x)
    (y * torch.arange(y.numel()).reshape(y.shape)).sum().backward()
    return [x.grad] + [p.grad for p in [*up.parameters(), *proj.parameters()] if p.grad is not None]

def equal(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))

plain = grads(block)
calls = []
impl = deferred.forward_impl
deferred.forward_impl = lambda a, k: calls.append(1) or impl(a, k)
out["checkpoint"] = equal(plain, grads(lambda x: blocks.checkpoint_block(block, (x,), {})))
out["deferred"] = equal(plain, grads(lambda x: blocks.checkpoint_block(block, (x,), {}, [proj])))
out["deferred_calls"] = len(calls)
out["frozen"] = equal(grads(block, frozen=True), grads(
    lambda x: blocks.checkpoint_block(block, (x,), {}, [proj]), frozen=True))
proj.weight.requires_grad_(True)
with blocks.deferring([proj]):
    y, _ = proj(torch.randn(6, 2, 24))
    out["placeholder_zeros"] = bool((y == 0).all()) and tuple(y.shape) == (6, 2, 16)
    out["placeholder_marked"] = getattr(y, blocks.MARK, False)
    out["reduce_passes_it"] = layers.reduce_from_tensor_model_parallel_region(y) is y

# the norm output: released after the forward, restored in backward, same gradients
norm = torch.nn.RMSNorm(16)
lin = torch.nn.Linear(16, 16)

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

# a last linear that is not megatron-core's RowParallelLinear (e.g. TransformerEngine's)
from types import SimpleNamespace
from megatron_musa_patch.core.errors import FeatureUnavailableError
from megatron_musa_patch.lib.recompute import wrappers
try:
    wrappers.last_linear(SimpleNamespace(linear_proj=torch.nn.Linear(2, 2)), "linear_proj")
    out["foreign_linear"] = "accepted"
except FeatureUnavailableError as exc:
    out["foreign_linear"] = str(exc)

base = grads(lambda x: normed(x, False))
out["norm_output"] = equal([*base], [*grads(lambda x: normed(x, True))])
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def pieces():
    proc = run_python(SCRIPT, env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), timeout=300,
                      cwd=str(__import__("pathlib").Path(__file__).resolve().parents[3]))
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("RESULT "):])


def test_block_checkpoint_matches_plain_autograd_bitwise(pieces):
    assert pieces["checkpoint"]


def test_skipped_forward_linear_gives_megatrons_gradients_bitwise(pieces):
    assert pieces["deferred"] and pieces["deferred_calls"] == 1
    assert pieces["frozen"]  # LinearWithFrozenWeight's backward (input gradient only)


def test_skipped_linear_returns_a_marked_zero_placeholder_the_all_reduce_passes(pieces):
    assert pieces["placeholder_zeros"] and pieces["placeholder_marked"]
    assert pieces["reduce_passes_it"]


def test_norm_output_is_released_and_recomputed_bitwise(pieces):
    assert pieces["released_bytes"] == 0 and pieces["norm_output"]


def test_variance_refuses_a_last_linear_it_cannot_skip(pieces):
    assert "SimpleNamespace.linear_proj is Linear" in pieces["foreign_linear"]
    assert "--transformer-impl local" in pieces["foreign_linear"]
