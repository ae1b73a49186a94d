"""fsdp_reduce_unfused: on the CPU row megatron-fsdp's gradient reduction (with its default
gradient_reduce_div_fusion) reduces with SUM after scaling, where upstream's PREMUL_SUM fails on
gloo; the result is the scaled sum, and the caller's config keeps its setting."""

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank

#: one gloo rank: the reduce op megatron-fsdp picks for fp32 gradients scaled by 0.25, used in
#: a reduce-scatter as its buffers use it
PROBE = "tests.features.probes.fsdp_reduce_premul"


def _lines(proc):
    return printed_lines(proc, ("reduced", "refused", "config"))


def test_the_gradients_are_scaled_then_summed(tmp_path):
    assert _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path)) == [
        f"reduced {[i * 0.25 for i in range(8)]}", "config fusion True"]


def test_without_the_feature_gloo_refuses_premul_sum(tmp_path):
    lines = _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path,
                                             MEGATRON_MUSA_PATCH_DISABLE="device.fsdp_reduce_unfused"))
    assert lines == ["refused Cannot use ReduceOp.PREMUL_SUM with Gloo", "config fusion True"]
