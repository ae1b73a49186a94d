"""Upstream's fusion defaults on every device: the ``megatron_musa_patch.ops`` ops plugged into
megatron-core's fusion points where the CUDA extensions (Apex, TransformerEngine, Megatron's
fused kernels) that upstream expects are missing, so no ``--no-*-fusion`` flag is needed.

* ``--gradient-accumulation-fusion`` (default on): ``fused_weight_gradient_mlp_cuda`` stand-in
  (``ops.grad_accum``: the weight gradient GEMM accumulates into ``main_grad``). Upstream raises
  in ``ColumnParallelLinear`` without Apex.
* ``--persist-layer-norm`` (default on; "use the fused norm kernel") and ``--sequence-parallel``
  with the local spec: ``WrappedTorchNorm`` asserts both off; with either it now builds
  ``ops.norm`` modules (torch's ``RMSNorm``/``LayerNorm`` parameters and state dict, the
  measured-fastest forward/backward; ``--no-persist-layer-norm`` keeps torch's norm; under sequence
  parallelism the parameters are marked ``sequence_parallel`` so ``finalize_model_grads``
  all-reduces their gradients across the tensor-parallel group).
* Apex installed without its CUDA extensions: megatron-core picks its ``FusedLayerNorm`` for
  LayerNorm models, whose kernel module is missing at the first forward; it runs ``ops.norm``.
* ``--masked-softmax-fusion`` (default on; used for fp16/bf16 scores): stand-ins for
  ``scaled_masked_softmax_cuda``, ``scaled_upper_triang_masked_softmax_cuda`` and
  ``scaled_softmax_cuda`` (``ops.softmax``, the kernels' semantics). Upstream fails importing them.
* ``--rope-fusion`` (default on with RoPE): megatron-core's ``fused_apply_rotary_pos_emb[_thd]``
  slots (TransformerEngine's) get ``ops.rope``, and ``apply_rotary_pos_emb`` routes fused calls
  to it with the full unfused semantics (interleaved, MLA channel order, ``mscale``, thd offsets).
  Upstream asserts/raises without TE. Multi-latent attention (whose fused RoPE is a triton
  kernel for CUDA) takes upstream's unfused RoPE path off CUDA instead of failing.
* ``--bias-swiglu-fusion``: ``bias_swiglu_impl`` runs ``ops.swiglu`` on the CPU (measured
  faster than upstream's eager function) and where ``ops.kernels`` has a SwiGLU kernel.
  ``--bias-gelu-fusion`` and ``--bias-dropout-fusion`` already work everywhere (``@jit_fuser``
  functions): untouched.

``MEGATRON_MUSA_PATCH_DISABLE=fused_ops`` restores upstream; the fusion defaults then fail, and
argument validation says which ``--no-*`` flags to add instead of letting upstream fail later.
"""

from __future__ import annotations

import importlib.util
import sys

from ..hookspecs import hookimpl
from ..registry import Patch

FEATURE = "fused_ops"
REQUIRED = False
DESCRIPTION = "upstream's fusion defaults (norm, softmax, RoPE, SwiGLU, wgrad accumulation) " \
              "on every device through megatron_musa_patch.ops"

WGRAD_MODULE = "fused_weight_gradient_mlp_cuda"
SOFTMAX_MODULES = ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda",
                   "scaled_softmax_cuda")
ROPE = "megatron.core.models.common.embeddings.rope_utils"
APEX_NORM = "megatron.core.fusions.fused_layer_norm"


@hookimpl
def mmp_register_patches(registry, device):
    registry.add(Patch(
        f"{FEATURE}.wgrad_accumulation", f"{WGRAD_MODULE}:*", "module", _fill_wgrad_module,
        FEATURE, condition=lambda: _module_missing(WGRAD_MODULE),
        why="--gradient-accumulation-fusion: weight gradients accumulate into main_grad"))
    for name in SOFTMAX_MODULES:
        registry.add(Patch(
            f"{FEATURE}.{name}", f"{name}:*", "module", _softmax_filler(name), FEATURE,
            condition=lambda n=name: _module_missing(n),
            why="--masked-softmax-fusion: fused scale+mask+softmax in fp32 (ops.softmax)"))
    registry.add(Patch(
        f"{FEATURE}.local_norm", "megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__",
        "wrap", _local_norm, FEATURE,
        why="local norms: --persist-layer-norm is a kernel hint, --sequence-parallel marks "
            "the weights; forward/backward from ops.norm"))
    registry.add(Patch(
        f"{FEATURE}.apex_layer_norm", f"{APEX_NORM}:FusedLayerNorm.forward", "wrap",
        _apex_layer_norm, FEATURE, condition=_apex_without_norm_kernels,
        why="Apex without its CUDA extensions: megatron-core's FusedLayerNorm runs ops.norm"))
    for slot in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        registry.add(Patch(
            f"{FEATURE}.{slot}", f"{ROPE}:{slot}", "attribute", _rope_slot(slot), FEATURE,
            condition=lambda s=slot: _rope_slot_empty(s),
            why="--rope-fusion without TransformerEngine: ops.rope"))
    registry.add(Patch(
        f"{FEATURE}.apply_rotary_pos_emb", f"{ROPE}:apply_rotary_pos_emb", "wrap", _apply_rope,
        FEATURE, condition=_te_missing,
        why="--rope-fusion: ops.rope with the unfused path's semantics (interleaved, thd, MLA)"))
    registry.add(Patch(
        f"{FEATURE}.rope_config_check",
        "megatron.core.transformer.transformer_config:TransformerConfig.__post_init__", "wrap",
        _config_with_our_rope, FEATURE, condition=_te_missing,
        why="--rope-fusion --rotary-interleaved: ops.rope handles it (upstream asks for TE 2.3)"))
    registry.add(Patch(
        f"{FEATURE}.mla_rope_unfused",
        "megatron.core.transformer.transformer_config:MLATransformerConfig.__post_init__", "wrap",
        _mla_without_fused_rope, FEATURE, devices=frozenset({"cpu", "musa"}),
        why="--rope-fusion with MLA needs triton on CUDA: MLA takes the unfused RoPE path here"))
    registry.add(Patch(
        f"{FEATURE}.bias_swiglu", "megatron.core.fusions.fused_bias_swiglu:bias_swiglu_impl",
        "wrap", _bias_swiglu, FEATURE, rebind=("megatron.core.transformer.mlp",
                                                "megatron.core.transformer.moe.shared_experts"),
        why="--bias-swiglu-fusion: ops.swiglu (measured faster than the eager function on CPU)"))


# ----------------------------------------------------------------------------- conditions


def _module_missing(name):
    return True if importlib.util.find_spec(name) is None else f"{name} is installed"


def _apex_without_norm_kernels():
    if importlib.util.find_spec("apex") is None:
        return "Apex is not installed (the local spec uses torch norms)"
    if importlib.util.find_spec("fused_layer_norm_cuda") is not None:
        return "Apex's fused_layer_norm_cuda is installed"
    return True


def _te_missing():
    return True if importlib.util.find_spec("transformer_engine") is None else "TE is installed"


def _rope_slot_empty(slot):
    module = sys.modules.get(ROPE)
    if module is not None and getattr(module, slot, None) is not None:
        return "TransformerEngine fills it"
    return True


# ----------------------------------------------------------------------------- stand-ins


def _fill_wgrad_module(module):
    from ..ops import grad_accum

    module.__doc__ = "megatron_musa_patch stand-in for Apex's gradient-accumulation fusion"
    module.wgrad_gemm_accum_fp32 = grad_accum.wgrad_gemm_accum_fp32
    module.wgrad_gemm_accum_fp16 = grad_accum.wgrad_gemm_accum_fp16


def _softmax_filler(name):
    def fill(module):
        from ..ops import softmax

        def impl(x):
            return softmax.raw(softmax.softmax_impl(x.device.type, x.numel()))

        module.__doc__ = f"megatron_musa_patch stand-in for {name} (ops.softmax)"
        if name == "scaled_upper_triang_masked_softmax_cuda":
            module.forward = lambda x, scale: impl(x).causal(x, float(scale))
        elif name == "scaled_masked_softmax_cuda":
            module.forward = lambda x, mask, scale: impl(x).masked(x, mask, float(scale))
        else:
            module.forward = lambda x, scale: impl(x).masked(x, None, float(scale))
        module.backward = lambda dy, y, scale: impl(y).backward(dy, y, float(scale))
        # ops.softmax takes any shape: one batch per block divides every batch count
        module.get_batch_per_block = lambda sq, sk, b, np: 1

    return fill


# ----------------------------------------------------------------------------- norms


def _norm_call(cls, config, hidden_size, eps=1e-5, *_, **__):
    return config, hidden_size, eps


def _local_norm(wrapped, instance, args, kwargs):
    config, hidden_size, eps = _norm_call(*args, **kwargs)
    fused = config.persist_layer_norm or config.sequence_parallel
    if (not fused or config.normalization not in ("LayerNorm", "RMSNorm")
            or config.layernorm_zero_centered_gamma or config.memory_efficient_layer_norm):
        return wrapped(*args, **kwargs)  # torch's norm, or upstream's assert naming the option
    from ..ops import norm

    module = norm.RMSNorm if config.normalization == "RMSNorm" else norm.LayerNorm
    return module(hidden_size, eps=eps, sequence_parallel=bool(config.sequence_parallel))


def _apex_layer_norm(wrapped, instance, args, kwargs):
    """FusedLayerNorm.forward when Apex's kernel modules are missing: the same module and
    parameters, computed by ops.norm (zero-centred gamma included), output viewless as upstream
    makes it for the pipeline schedule."""
    if len(instance.hidden_size) != 1:
        return wrapped(*args, **kwargs)
    from megatron.core.utils import make_viewless_tensor

    from ..ops import norm

    x = args[0] if args else kwargs["input"]
    weight = instance.weight + 1 if instance.zero_centered_gamma else instance.weight
    out = norm.layer_norm(x, weight, instance.bias, instance.eps)
    return make_viewless_tensor(inp=out, requires_grad=x.requires_grad, keep_graph=True)


# ----------------------------------------------------------------------------- RoPE


def _rope_slot(slot):
    from ..ops import rope

    return getattr(rope, slot)


def _rope_call(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    return t, freqs, config, cu_seqlens, mscale, cp_group


def _apply_rope(wrapped, instance, args, kwargs):
    t, freqs, config, cu_seqlens, mscale, cp_group = _rope_call(*args, **kwargs)
    module = sys.modules[ROPE]
    from ..ops import rope

    ours = getattr(module, "fused_apply_rotary_pos_emb", None) is rope.fused_apply_rotary_pos_emb
    mrope = getattr(config, "mrope_section", None) is not None
    if not (config.apply_rope_fusion and ours) or mrope:
        return wrapped(*args, **kwargs)
    mla = bool(getattr(config, "multi_latent_attention", False))
    if cu_seqlens is None:
        return rope.apply_rope_bshd(t, freqs, config.rotary_interleaved, mla, mscale)
    if cp_group is None:
        from megatron.core import parallel_state

        cp_group = parallel_state.get_context_parallel_group()
    return rope.apply_rope_thd(t, cu_seqlens, freqs, config.rotary_interleaved, mla, mscale,
                               cp_group.size(), cp_group.rank())


def _config_with_our_rope(wrapped, instance, args, kwargs):
    """Upstream's __post_init__ demands TE >= 2.3 for fused interleaved RoPE; ops.rope does it:
    skip only that check (the rest of __post_init__ runs unchanged)."""
    from ..ops import rope

    module = sys.modules.get(ROPE)
    ours = module is not None and getattr(module, "fused_apply_rotary_pos_emb", None) is \
        rope.fused_apply_rotary_pos_emb
    skip = (ours and getattr(instance, "apply_rope_fusion", False)
            and getattr(instance, "rotary_interleaved", False)
            and not getattr(instance, "multi_latent_attention", False))
    if not skip:
        return wrapped(*args, **kwargs)
    instance.apply_rope_fusion = False
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.apply_rope_fusion = True


_said = set()


def _mla_without_fused_rope(wrapped, instance, args, kwargs):
    """MLA's fused RoPE (``fused_mla_yarn_rope_apply``) is a triton kernel for CUDA; off CUDA the
    default --rope-fusion would fail in the first forward (or, for rope_type 'rope', in this
    __post_init__). MLA then takes upstream's unfused RoPE path: the same numbers."""
    if getattr(instance, "apply_rope_fusion", False):
        instance.apply_rope_fusion = False
        if "mla" not in _said:
            _said.add("mla")
            import logging

            logging.getLogger("megatron_musa_patch").info(
                "megatron_musa_patch: multi-latent attention uses the unfused RoPE path (its "
                "fused kernel is triton on CUDA); --no-rope-fusion is not needed")
    return wrapped(*args, **kwargs)


# ----------------------------------------------------------------------------- SwiGLU


def _swiglu_call(input, bias, fp8_input_store=False, cpu_offload_input=False):
    return input, bias, fp8_input_store, cpu_offload_input


def _bias_swiglu(wrapped, instance, args, kwargs):
    x, bias, fp8_input_store, cpu_offload_input = _swiglu_call(*args, **kwargs)
    from ..ops import swiglu

    impl = swiglu.swiglu_impl(x.device.type, x.numel())
    if fp8_input_store or cpu_offload_input or (impl != "kernel" and x.device.type != "cpu"):
        return wrapped(*args, **kwargs)  # upstream's @jit_fuser function (torch.compile on CUDA)
    return swiglu.bias_swiglu(x, bias, impl)


# ----------------------------------------------------------------------------- validation


@hookimpl
def mmp_validate_args(args, device):
    """With the feature off (or broken), name the --no-* flags the run needs instead of letting
    upstream fail deep inside model construction."""
    from ..activation import current

    registry = current().registry
    if FEATURE in registry.disabled_features:
        why = "is switched off (MEGATRON_MUSA_PATCH_DISABLE / MEGATRON_MUSA_PATCH_ONLY)"
    elif registry.feature_problems(FEATURE):
        why = f"did not apply ({registry.feature_problems(FEATURE)[0]})"
    else:
        return
    missing = _fusions_without_kernels(args)
    if not missing:
        return
    from ..errors import FeatureUnavailableError

    raise FeatureUnavailableError(
        f"upstream's fusion defaults (on unless --no-* flags say otherwise) need CUDA extensions "
        f"this machine lacks "
        f"({'; '.join(what for what, _ in missing)}), and the '{FEATURE}' feature that provides "
        f"them {why}. Switch the feature back on, or add "
        f"{' '.join(flag for _, flag in missing if flag)} to the arguments"
        f"{' and remove --sequence-parallel' if any(not f for _, f in missing) else ''}.")


def _fusions_without_kernels(args):
    local = getattr(args, "transformer_impl", "transformer_engine") == "local"
    te = importlib.util.find_spec("transformer_engine") is not None
    apex = importlib.util.find_spec("apex") is not None
    found = []
    if getattr(args, "gradient_accumulation_fusion", False) and _module_missing(WGRAD_MODULE) \
            is True and not (te and not local):
        found.append((f"gradient-accumulation fusion needs {WGRAD_MODULE} (Apex)",
                      "--no-gradient-accumulation-fusion"))
    if local and not apex:
        if not getattr(args, "no_persist_layer_norm", True):
            found.append(("the persistent layer norm: the local spec's torch norms assert it off",
                          "--no-persist-layer-norm"))
        if getattr(args, "sequence_parallel", False):
            found.append(("--sequence-parallel: the local spec's torch norms assert it off", ""))
    low_precision = getattr(args, "fp16", False) or getattr(args, "bf16", False)
    if getattr(args, "masked_softmax_fusion", False) and low_precision and local and \
            _module_missing("scaled_masked_softmax_cuda") is True:
        found.append(("masked-softmax fusion needs scaled_masked_softmax_cuda (Megatron's "
                      "fused kernels)", "--no-masked-softmax-fusion"))
    rope = getattr(args, "position_embedding_type", None) == "rope" or getattr(
        args, "use_rotary_position_embeddings", False) or getattr(
        args, "multi_latent_attention", False)
    if getattr(args, "apply_rope_fusion", False) and rope and not te:
        found.append(("RoPE fusion needs TransformerEngine", "--no-rope-fusion"))
    return found
