"""The fused norm without Apex: the local spec's norms, and Apex's ``FusedLayerNorm`` when Apex
is installed without its CUDA extensions.

* ``--persist-layer-norm`` (default on; "use the fused norm kernel") and ``--sequence-parallel``
  with the local spec: ``WrappedTorchNorm`` asserts both off; with either it now builds
  ``ops.norm`` modules (torch's ``RMSNorm``/``LayerNorm`` parameters and state dict, the
  measured-fastest forward/backward; ``--no-persist-layer-norm`` keeps torch's norm; under
  sequence parallelism the parameters are marked ``sequence_parallel`` so
  ``finalize_model_grads`` all-reduces their gradients across the tensor-parallel group).
* Apex installed without its CUDA extensions: megatron-core picks its ``FusedLayerNorm`` for
  LayerNorm models, whose kernel module is missing at the first forward; it runs ``ops.norm``.
"""

from __future__ import annotations

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import importable
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from .spec import local_spec
from megatron_musa_patch.core.feature import feature


APEX_NORM = "megatron.core.fusions.fused_layer_norm"


def _local_without_apex(args) -> bool:
    return local_spec(args) and not importable("apex")


FEATURE = feature(
    __name__,
    "fused norms without Apex (ops.norm): --persist-layer-norm, --sequence-parallel",
    flag_needs=(
        FlagNeed("--persist-layer-norm",
                 when=lambda args: _local_without_apex(args)
                 and not getattr(args, "no_persist_layer_norm", True),
                 because="on by default; the local spec's torch norms assert it off",
                 instead="add --no-persist-layer-norm"),
        FlagNeed("--sequence-parallel",
                 when=lambda args: _local_without_apex(args)
                 and getattr(args, "sequence_parallel", False),
                 because="the local spec's torch norms assert it off"),
    ))


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "local_norm", "megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__",
        "wrap", _local_norm,
        why="local norms: --persist-layer-norm is a kernel hint, --sequence-parallel marks "
            "the weights; forward/backward from ops.norm"))
    registry.add(FEATURE.patch(
        "apex_layer_norm", f"{APEX_NORM}:FusedLayerNorm.forward", "wrap",
        _apex_layer_norm, condition=_apex_without_norm_kernels,
        why="Apex without its CUDA extensions: megatron-core's FusedLayerNorm runs ops.norm"))


def _apex_without_norm_kernels():
    if not importable("apex"):
        return "Apex is not installed (the local spec uses torch norms)"
    if importable("fused_layer_norm_cuda"):
        return "Apex's fused_layer_norm_cuda is installed"
    return True


def _local_norm(wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    config, hidden_size, eps = call["config"], call["hidden_size"], call["eps"]
    fused = config.persist_layer_norm or config.sequence_parallel
    if (not fused or config.normalization not in ("LayerNorm", "RMSNorm")
            or config.layernorm_zero_centered_gamma or config.memory_efficient_layer_norm):
        return wrapped(*args, **kwargs)  # torch's norm, or upstream's assert naming the option
    from megatron_musa_patch.lib.ops import norm

    module = norm.RMSNorm if config.normalization == "RMSNorm" else norm.LayerNorm
    return module(hidden_size, eps=eps, sequence_parallel=bool(config.sequence_parallel))


def _apex_layer_norm(wrapped, instance, args, kwargs):
    """FusedLayerNorm.forward when Apex's kernel modules are missing: the same module and
    parameters, computed by ops.norm (zero-centred gamma included), output viewless as upstream
    makes it for the pipeline schedule."""
    if len(instance.hidden_size) != 1:
        return wrapped(*args, **kwargs)
    from megatron.core.utils import make_viewless_tensor

    from megatron_musa_patch.lib.ops import norm

    x = call_arguments(wrapped, args, kwargs)["input"]
    weight = instance.weight + 1 if instance.zero_centered_gamma else instance.weight
    out = norm.layer_norm(x, weight, instance.bias, instance.eps)
    return make_viewless_tensor(inp=out, requires_grad=x.requires_grad, keep_graph=True)
