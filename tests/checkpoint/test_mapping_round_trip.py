"""Every family's table, run both ways on a tiny transformers model of it, without Megatron: the
import direction reads every Hugging Face tensor once, the export direction gives each back bit
for bit, and the flags name the sizes of the tensors the import makes. Fast, for all families;
tests/checkpoint/test_hf_families.py runs the same models through Megatron."""

import json
from collections import Counter

import pytest
import torch

from megatron_musa_patch.checkpoint import families
from megatron_musa_patch.checkpoint.families.table import EMBEDDING

from tests.checkpoint import tiny_models

MODELS = sorted(tiny_models.FAMILIES) + sorted(tiny_models.RENAMED) + ["deepseek_v3_mtp"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            from safetensors.torch import load_file

            directory = tiny_models.make(name, tmp_path_factory.mktemp(name))
            config = json.loads((directory / "config.json").read_text())
            cache[name] = config, load_file(str(directory / "model.safetensors"))
        return cache[name]
    return get


@pytest.mark.parametrize("name", MODELS)
def test_the_table_maps_every_tensor_and_back_bit_for_bit(made, name):
    config, hf = made(name)
    family = families.family_of(config)
    family.check(config)
    read = Counter()

    def get(hf_name):
        read[hf_name] += 1
        return hf[hf_name]

    megatron = dict(families.to_megatron(config, get))
    copies = [n for n in hf if ".embed_tokens." in n or ".shared_head.head." in n]
    assert sorted(read) == sorted(hf), set(hf) ^ set(read)
    # each tensor read once, save the ones an MTP layer's copies are compared with
    assert {n for n, c in read.items() if c > 1} <= {"model.embed_tokens.weight",
                                                     "lm_head.weight"} | set(copies)
    back = dict(families.to_hf(config, megatron.__getitem__))
    assert sorted(back) == sorted(hf)
    for key, tensor in hf.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    flags = family.flags(config)
    hidden = int(flags[flags.index("--hidden-size") + 1])
    assert megatron[EMBEDDING].shape == (config["vocab_size"], hidden)
    layers = int(flags[flags.index("--num-layers") + 1])
    assert {n.split(".")[2] for n in megatron if n.startswith("decoder.layers.")} == \
        {str(i) for i in range(layers)}


def test_a_wrong_layout_is_not_an_identity():
    """The round trip is a test: a fused QKV put back in another head order fails it."""
    from megatron_musa_patch.checkpoint.families.rows import GroupedQKV

    dims = {"heads": 4, "groups": 2, "head_dim": 2}
    row = GroupedQKV("qkv", "q", "k", "v")
    q, k, v = torch.randn(8, 3), torch.randn(4, 3), torch.randn(4, 3)
    fused = row.to_megatron([q, k, v], dims)
    assert all(torch.equal(a, b) for a, b in zip(row.to_hf(fused, dims), (q, k, v)))
    assert not torch.equal(fused, torch.cat([q, k, v]))  # grouped, not stacked
    swapped = row.to_hf(fused, {**dims, "groups": 1, "heads": 2, "head_dim": 4})
    assert not all(torch.equal(a, b) for a, b in zip(swapped, (q, k, v)))
