"""The CLIP / SigLIP vision encoder's norms without TransformerEngine.

``megatron.core.models.vision.clip_vit_model`` takes ``TENorm`` as the default of
``CLIPViTModel``'s ``ln_pre_impl`` / ``ln_post_impl`` and, without TE, ``torch.nn.LayerNorm``.
It then builds them with ``build_module(impl, config=..., hidden_size=..., eps=...)``, which
``torch.nn.LayerNorm`` does not take: every LLaVA / CLIP model without TE fails to build
(``LayerNorm.__init__() got an unexpected keyword argument 'config'``), even from the local
spec. The fix gives those parameters megatron-core's own ``WrappedTorchNorm``, the local spec's
norm without Apex, which takes that signature and, like ``TENorm``, follows
``config.normalization``.
"""

from __future__ import annotations

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import te_missing
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "CLIPViTModel's default norms build without TE (WrappedTorchNorm, not nn.LayerNorm)")

NORM_PARAMETERS = ("ln_pre_impl", "ln_post_impl")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", "megatron.core.models.vision.clip_vit_model:CLIPViTModel.__init__", "wrap",
        _init_with_buildable_norms, condition=te_missing,
        why="torch.nn.LayerNorm, the default without TE, cannot be built with config="))


def _init_with_buildable_norms(wrapped, instance, args, kwargs):
    import torch
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    call = call_arguments(wrapped, args, kwargs)
    for name in NORM_PARAMETERS:
        if call.get(name) is torch.nn.LayerNorm:  # upstream's default without TE
            call[name] = WrappedTorchNorm
    return wrapped(**call)
