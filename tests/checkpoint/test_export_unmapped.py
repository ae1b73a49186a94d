"""export-hf refuses a checkpoint whose model holds tensors the family's mapping has no Hugging
Face name for (they would be dropped without a word), before it writes anything. The model here
is the mapping's own image of a tiny transformers model (families.to_megatron), so no Megatron
is needed; the whole export path runs in tests/checkpoint/test_hf_families.py."""

import json

import pytest

from megatron_musa_patch.checkpoint import families, worker
from megatron_musa_patch.checkpoint.errors import ConversionError
from megatron_musa_patch.checkpoint.plan import Plan

from tests.checkpoint.tiny_models import make


class StateOnly:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return dict(self.state)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import torch
    from safetensors.torch import load_file

    directory = make("llama", tmp_path_factory.mktemp("hf"))
    config = json.loads((directory / "config.json").read_text())
    hf = load_file(str(directory / "model.safetensors"))
    state = {name: tensor.clone() for name, tensor in families.to_megatron(config, hf.__getitem__)}
    assert all(isinstance(t, torch.Tensor) for t in state.values())
    return config, state, hf


def plan_for(config, out):
    return Plan(hf_config=config, dtype="float32", hf_out=str(out), max_shard_bytes=1 << 30)


def test_every_tensor_mapped_exports_the_original_tensors(llama, tmp_path):
    from safetensors.torch import load_file

    config, state, hf = llama
    worker.dump(plan_for(config, tmp_path / "out"), [StateOnly(state)])
    written = {}
    for shard in (tmp_path / "out").glob("*.safetensors"):
        written.update(load_file(str(shard)))
    assert sorted(written) == sorted(hf)
    assert all(written[name].equal(hf[name]) for name in hf)
    # the directory's mode is the user's umask's, as save_pretrained's (mkdtemp's is 0700)
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~mask


def test_a_tensor_the_mapping_does_not_know_is_refused_before_anything_is_written(llama,
                                                                                  tmp_path):
    import torch

    config, state, _ = llama
    extra = "decoder.layers.0.self_attention.q_layernorm.weight"  # --qk-layernorm on Llama
    with pytest.raises(ConversionError) as raised:
        worker.dump(plan_for(config, tmp_path / "out"),
                    [StateOnly({**state, extra: torch.ones(16)})])
    text = str(raised.value)
    assert text.startswith("mmp checkpoint export-hf: the checkpoint's model holds 1 tensor(s) "
                           "the LlamaForCausalLM mapping has no Hugging Face name for: "
                           f"{extra}. Exported without them"), text
    assert text.endswith("Nothing was written.")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
