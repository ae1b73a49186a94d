"""features/fused_ops: which flags each fusion's plugin answers for when it is off (its
FLAG_NEEDS), and the records the fusions register (the end-to-end checks are
tests/features/fused_ops/test_megatron_core.py and tests/features/fused_ops/test_stock.py)."""

from types import SimpleNamespace

from megatron_musa_patch.features import group

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
    from tests.conftest import run_python, subprocess_env

    code = """
import megatron_musa_patch, torch
from megatron_musa_patch.lib.ops import softmax, norm, swiglu, rope
x = torch.randn(2, 3, 8, 8, dtype=torch.bfloat16); m = torch.ones(8, 8, dtype=torch.bool).triu(1)
w, r, h = torch.ones(8), torch.ones(6, 1), x.reshape(-1, 8)[:6]
cases = [(softmax._fwd, (x, m, 0.1)), (softmax._bwd, (x, x, 0.1)),
         (norm._rms_fwd, (h, w, 1e-5)),
         (norm._rms_bwd, (h, h, w, r)),
         (swiglu._fwd32, (x, None)), (swiglu._bwd32, (x[..., :4], x, None)),
         (rope._fwd, (x, x, x, False)), (rope._bwd, (x, x, x, True))]
for fn, args in cases:
    e = torch._dynamo.explain(fn)(*args)
    assert (e.graph_count, e.graph_break_count) == (1, 0), (fn.__name__, e.break_reasons)
print("one graph each")
"""
    proc = run_python(code, env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert "one graph each" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_mla_takes_the_unfused_rope_path_off_cuda():
    """MLA's fused RoPE is a triton kernel for CUDA: with the default --rope-fusion, building
    its config must not fail here (rope_type 'rope' raised in __post_init__ upstream)."""
    from tests.conftest import run_python, subprocess_env

    code = """
import megatron_musa_patch
from megatron.core.transformer.transformer_config import MLATransformerConfig
for rope_type in ("rope", "yarn"):
    config = MLATransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, multi_latent_attention=True,
        q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16,
        rope_type=rope_type, apply_rope_fusion=True)
    assert config.apply_rope_fusion is False, rope_type
print("unfused MLA RoPE")
"""
    proc = run_python(code, env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert "unfused MLA RoPE" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
