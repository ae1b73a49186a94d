"""features/fused_ops: which flags each fusion's plugin answers for when it is off (its
FLAG_NEEDS), and the records the fusions register (the end-to-end checks are
tests/features/fused_ops/test_megatron_core.py and tests/features/fused_ops/test_stock.py)."""

from types import SimpleNamespace

from megatron_musa_patch.features import group

from tests.conftest import run_probe, subprocess_env
from tests.harness.sessions import make_session

FUSIONS = group("fused_ops")

DEFAULTS = dict(transformer_impl="local", gradient_accumulation_fusion=True,
                no_persist_layer_norm=False, sequence_parallel=False, masked_softmax_fusion=True,
                bf16=False, fp16=False, apply_rope_fusion=True, position_embedding_type="rope")


def flags(**overrides):
    """What the fusions' FLAG_NEEDS tell a run to do with every fusion off: the fix per flag."""
    args = SimpleNamespace(**{**DEFAULTS, **overrides})
    return [need.instead or f"remove {need.flag}" for plugin in FUSIONS
            for need in plugin.FEATURE.flag_needs if need.applies(args, "cpu")]


def test_upstream_defaults_on_this_machine_need_these_flags():
    assert sorted(flags()) == ["add --no-gradient-accumulation-fusion",
                               "add --no-persist-layer-norm", "add --no-rope-fusion"]
    assert "add --no-masked-softmax-fusion" in flags(bf16=True)  # fused only for 16-bit scores
    assert "add --no-rope-fusion" not in flags(position_embedding_type="learned_absolute")
    assert "remove --sequence-parallel" in flags(sequence_parallel=True)


def test_each_fusion_is_its_own_switch():
    names = {p.FEATURE.name for p in FUSIONS}
    assert names == {"fused_ops.wgrad_accumulation", "fused_ops.norm", "fused_ops.softmax",
                     "fused_ops.rope", "fused_ops.swiglu"}
    session = make_session(*FUSIONS, disable=("fused_ops.rope",))
    assert [n for n in sorted(names) if session.why_unavailable(n)] == ["fused_ops.rope"]


def test_the_all_no_flags_run_needs_nothing():
    assert flags(gradient_accumulation_fusion=False, no_persist_layer_norm=True,
                 masked_softmax_fusion=False, apply_rope_fusion=False, bf16=True) == []


def test_records_target_each_fusion_point():
    session = make_session(*FUSIONS)
    registry = session.registry
    session.plugins.hook.mmp_register_patches(session=session, registry=registry,
                                              device=session.device)
    targets = {p.target: p.feature for p in registry.patches()}
    assert targets["fused_weight_gradient_mlp_cuda:*"] == "fused_ops.wgrad_accumulation"
    assert targets["scaled_masked_softmax_cuda:*"] == "fused_ops.softmax"
    assert targets["megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__"] == \
        "fused_ops.norm"
    assert targets["megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl"] == \
        "fused_ops.swiglu"
    assert all(p.feature.startswith("fused_ops.") and not p.strict for p in registry.patches())


def test_compiled_formulas_trace_whole_with_the_layer_active():
    """The device layer wraps torch factories and Tensor.to; a formula dynamo cannot trace would
    silently run eagerly. Every compiled formula must stay one graph with the CPU row active."""
    proc = run_probe("tests.features.fused_ops.probes.compiled_formulas",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert "one graph each" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_mla_takes_the_unfused_rope_path_off_cuda():
    """MLA's fused RoPE is a triton kernel for CUDA: with the default --rope-fusion, building
    its config must not fail here (rope_type 'rope' raised in __post_init__ upstream)."""
    proc = run_probe("tests.features.fused_ops.probes.mla_rope_config",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert "unfused MLA RoPE" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
