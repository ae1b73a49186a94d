"""export-hf hands the Hugging Face writer the model's own memory wherever safetensors allows it
(``checkpoint/worker.py``, ``_own_storage``): contiguous pieces of one tensor that do not
overlap (gate and up of the fused fc1: nearly half of a 1B Llama) are written from where they
lie; a piece that is not contiguous (q, k, v of the fused QKV) or that overlaps one already
handed out (the MTP layers' copies of the embedding) is copied, since safetensors refuses
overlapping memory. What is written equals the pieces either way."""

import torch
from safetensors.torch import load_file

from megatron_musa_patch.checkpoint.hf import SINGLE, HFWriter
from megatron_musa_patch.checkpoint.worker import _own_storage


def _storage(tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_pieces_are_written_from_the_model_unless_they_overlap_or_are_strided(tmp_path):
    fc1 = torch.randn(8, 3).to(torch.bfloat16)
    qkv = torch.randn(6, 4)
    handed: dict = {}
    gate, up = (_own_storage(half, handed) for half in fc1.chunk(2))
    # the same memory, not copies
    assert (gate.data_ptr(), up.data_ptr()) == (fc1.data_ptr(), fc1[4:].data_ptr())
    column = _own_storage(qkv[:, 1], handed)  # strided: copied
    assert _storage(column) != _storage(qkv) and column.is_contiguous()
    middle = _own_storage(fc1[2:6], handed)  # overlaps gate and up: copied
    assert _storage(middle) != _storage(fc1)
    whole = _own_storage(qkv, handed)  # does not overlap the copy taken of its column
    assert whole.data_ptr() == qkv.data_ptr()

    writer = HFWriter(tmp_path / "out")
    for name, tensor in (("gate", gate), ("up", up), ("column", column), ("middle", middle),
                         ("whole", whole)):
        writer.add(name, tensor)
    writer.finish({"architectures": ["LlamaForCausalLM"]})
    written = load_file(str(tmp_path / "out" / SINGLE))
    expected = {"gate": fc1[:4], "up": fc1[4:], "column": qkv[:, 1], "middle": fc1[2:6],
                "whole": qkv}
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name
