"""The pieces of the recompute feature on small tensors: the argument plumbing of a block
checkpoint, the skipped-forward linear (Megatron's backward from the saved output gradient),
the all-reduce pass-through and the released-and-recomputed norm output -- each bitwise equal
to plain autograd."""

import json

import pytest
import torch

from megatron_musa_patch.lib.recompute import blocks

from tests.conftest import run_probe, subprocess_env


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


PROBE = "tests.lib.recompute.probes.pieces"


@pytest.fixture(scope="module")
def pieces():
    proc = run_probe(PROBE, env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), timeout=300)
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
