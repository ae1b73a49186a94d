"""fsdp_reduce_unfused: on the CPU row megatron-fsdp's gradient reduction (with its default
gradient_reduce_div_fusion) reduces with SUM after scaling, where upstream's PREMUL_SUM fails on
gloo; the result is the scaled sum, and the caller's config keeps its setting."""

from tests.conftest import printed_lines, run_on_one_cpu_rank

#: one gloo rank: the reduce op megatron-fsdp picks for fp32 gradients scaled by 0.25, used in
#: a reduce-scatter as its buffers use it
PROBE = """
import sys
import megatron_musa_patch
import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer as buffers

dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
config = DistributedDataParallelConfig(gradient_reduce_div_fusion=True)
grad = torch.arange(8, dtype=torch.float32)
op = buffers.gradient_reduce_preprocessing(grad, 0.25, config)
out = torch.empty(8)
try:
    dist.reduce_scatter_tensor(out, grad, op=op)
    print("reduced", out.tolist())
except RuntimeError as error:
    print("refused", str(error).splitlines()[0])
print("config fusion", config.gradient_reduce_div_fusion)
"""


def _lines(proc):
    return printed_lines(proc, ("reduced", "refused", "config"))


def test_the_gradients_are_scaled_then_summed(tmp_path):
    assert _lines(run_on_one_cpu_rank(PROBE, tmp_path)) == [
        f"reduced {[i * 0.25 for i in range(8)]}", "config fusion True"]


def test_without_the_feature_gloo_refuses_premul_sum(tmp_path):
    lines = _lines(run_on_one_cpu_rank(PROBE, tmp_path,
                                       MEGATRON_MUSA_PATCH_DISABLE="fsdp_reduce_unfused"))
    assert lines == ["refused Cannot use ReduceOp.PREMUL_SUM with Gloo", "config fusion True"]
