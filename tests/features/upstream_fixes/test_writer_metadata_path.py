"""upstream_fixes.writer_metadata_path: megatron-core 0.16's
``dist_checkpointing.remove_sharded_tensors`` works on a torch whose checkpoint writer has no
``metadata_path``: the prefixed tensors leave the metadata and their files go."""

import pytest
from packaging.version import Version

from tests.conftest import printed_lines, run_on_one_cpu_rank

#: one gloo rank saves two sharded tensors (the second under the prefix, in files of its own),
#: removes the prefixed one, then reads what the checkpoint still holds
PROBE = """
import os, sys
from pathlib import Path
import megatron_musa_patch
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.dist_checkpointing import ShardedTensor, remove_sharded_tensors, save
from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
from torch.distributed.checkpoint import FileSystemReader

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
parallel_state.initialize_model_parallel()
ckpt = Path(sys.argv[1] + ".ckpt")  # upstream joins it with /
os.makedirs(ckpt)
state_dict = {"a": ShardedTensor.from_rank_offsets("keyA", torch.ones(2, 4)),
              "b": ShardedTensor.from_rank_offsets("prefix_b", torch.ones(3, 5))}
save(state_dict, ckpt, TorchDistSaveShardedStrategy("torch_dist", 1, separation_hint="prefix"))
print("before", sorted(FileSystemReader(ckpt).read_metadata().state_dict_metadata))
try:
    remove_sharded_tensors(ckpt, key_prefix="prefix")
except AttributeError as error:
    print("refused", error)
print("after", sorted(FileSystemReader(ckpt).read_metadata().state_dict_metadata),
      sorted(f for f in os.listdir(ckpt) if f.startswith("prefix")))
"""


def _needs_0_16():
    from megatron_musa_patch.upstream import installed

    return installed.megatron_core_version() >= Version("0.17")


pytestmark = pytest.mark.skipif(_needs_0_16(), reason="megatron-core 0.17 reads the metadata path "
                                                      "itself (the fix is for 0.16)")


def _lines(proc):
    return printed_lines(proc, ("before", "after", "refused"))


def test_remove_sharded_tensors_drops_the_prefixed_tensors(tmp_path):
    assert _lines(run_on_one_cpu_rank(PROBE, tmp_path)) == [
        "before ['keyA', 'prefix_b']", "after ['keyA'] []"]


def test_without_the_fix_it_fails_on_the_writer(tmp_path):
    lines = _lines(run_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.writer_metadata_path"))
    assert lines[1] == "refused 'FileSystemWriter' object has no attribute 'metadata_path'"
    assert lines[2].startswith("after ['keyA', 'prefix_b']")
