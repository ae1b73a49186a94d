"""The checkpoint's args read from the pickle alone (checkpoint/saved_args.py): the same plain
values torch.load gives, without torch, megatron-core or the tensors' bytes; None (so the
caller uses torch.load) for what it does not follow."""

import argparse
import enum
import sys

import torch

from megatron_musa_patch.checkpoint import saved_args

from tests.conftest import run_probe, subprocess_env


def saved(path, crc32=True):
    from megatron.core.enums import ModelType

    args = argparse.Namespace(hidden_size=64, num_layers=2, bf16=True, fp16=False,
                              tokenizer_type="NullTokenizer", load=None, rotary_base=10000.0,
                              moe_layer_freq=[1, 0], params_dtype=torch.bfloat16,
                              model_type=ModelType.encoder_or_decoder)
    state = {"args": args, "iteration": 3, "model": {"w": torch.arange(6.0)}}
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(crc32)
    try:
        torch.save(state, path)
    finally:
        torch.serialization.set_crc32_options(before)
    return args


def plain(args, like):
    """``args``' values of the names whose value in ``like`` is plain (no dtype, no enum)."""
    return {k: getattr(args, k) for k, v in vars(like).items()
            if not isinstance(v, (torch.dtype, enum.Enum))}


def test_plain_values_as_torch_load_gives_them_with_or_without_crc32(tmp_path):
    for crc32 in (True, False):  # import-hf saves without CRC-32
        path = tmp_path / f"common{crc32}.pt"
        args = saved(path, crc32)
        read = saved_args.read(path)
        assert read is not None
        loaded = torch.load(path, weights_only=False)["args"]
        assert plain(read, args) == plain(args, args) == plain(loaded, args)
        assert len(plain(args, args)) == 8
        assert set(vars(read)) == set(vars(args))
        # what torch or megatron-core would have built is a stand-in that says what it stands for
        assert isinstance(read.params_dtype, type) and issubclass(read.params_dtype,
                                                                  saved_args.Opaque)
        assert "megatron.core.enums.ModelType" in repr(read.model_type)


def test_it_imports_neither_torch_nor_megatron(tmp_path):
    path = tmp_path / "common.pt"
    saved(path)
    proc = run_probe("tests.checkpoint.probes.read_args", path,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_AUTOACTIVATE="0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["64", "[]"]


def test_what_it_does_not_follow_is_left_to_torch_load(tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save({"args": argparse.Namespace(a=1)}, legacy, _use_new_zipfile_serialization=False)
    no_args = tmp_path / "no_args.pt"
    torch.save({"iteration": 1}, no_args)
    assert saved_args.read(legacy) is None and saved_args.read(no_args) is None
    assert saved_args.read(tmp_path / "missing.pt") is None
    assert "torch" in sys.modules  # this test process's own, not the reader's


def test_a_torch_dist_checkpoint_it_cannot_place_is_left_to_megatron_core(tmp_path):
    # the real 0.19 layout is read in tests/checkpoint/test_hf_llama.py (against megatron-core's
    # own reader); here what it must not follow: no metadata, a damaged one, no common state
    assert saved_args.read_dist(tmp_path) is None
    (tmp_path / ".metadata").write_bytes(b"not a pickle")
    assert saved_args.read_dist(tmp_path) is None
    import pickle

    (tmp_path / ".metadata").write_bytes(pickle.dumps({"storage_data": {}}))
    assert saved_args.read_dist(tmp_path) is None
