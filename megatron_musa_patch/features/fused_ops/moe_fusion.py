"""``--moe-permute-fusion`` and ``--moe-grouped-gemm`` without TransformerEngine or the
``grouped_gemm`` package.

Upstream (megatron-core 0.16.1) without TE: ``--moe-permute-fusion`` fails when the
TransformerConfig is built (``TransformerConfig.__post_init__`` imports ``fused_permute`` & co.
from ``moe_utils``, which defines them only when TE imports: ImportError), and
``moe_utils.permute/unpermute/sort_chunks_by_idxs(fused=True)`` raise "Please install TE".
``--moe-grouped-gemm`` on the local spec selects the legacy ``GroupedMLP``, which asserts the
``grouped_gemm`` package and bf16; Megatron-LM's ``validate_args`` also asserts a CUDA compute
capability >= 8 (``torch.cuda.get_device_capability()``: (0, 0) on the CPU row, MUSA's own
numbering on MUSA).

This feature, when TE (permute) or the grouped_gemm package (GEMM) is missing:

* provides ``moe_utils.fused_*`` (TE's signatures) from ``ops.moe_permute`` and routes the
  ``fused=True`` calls of ``permute``/``unpermute``/``sort_chunks_by_idxs`` there (results equal
  the non-fused path);
* serves ``grouped_gemm_util.ops.gmm`` from ``ops.grouped_gemm`` (torch's grouped_mm or a loop
  over experts); ``GroupedMLP`` then also runs in fp32/fp16 (its bf16 assertion guards the
  package's bf16-only kernel, not the math);
* lets ``--moe-grouped-gemm`` through Megatron-LM's compute-capability assertion when this
  implementation serves it.
"""

from __future__ import annotations

import copy

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import importable, te_installed
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature


MOE_UTILS = "megatron.core.transformer.moe.moe_utils"
TE_FUSED = ("fused_permute", "fused_permute_with_probs", "fused_unpermute",
            "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs")
#: args attribute marking that --moe-grouped-gemm was hidden from Megatron's capability check
_HIDDEN = "_mmp_moe_grouped_gemm_hidden"


def grouped_gemm_package_missing() -> bool:
    return not importable("grouped_gemm")


def _without_te():
    return True if not te_installed() else "TransformerEngine is installed: its fused permute serves"


def _without_grouped_gemm():
    return True if grouped_gemm_package_missing() else "the grouped_gemm package serves"


def _permute_fusion_needs_us(args) -> bool:
    return getattr(args, "moe_permute_fusion", False) and not te_installed()


def _grouped_gemm_needs_us(args) -> bool:
    return getattr(args, "moe_grouped_gemm", False) and grouped_gemm_package_missing() and (
        getattr(args, "transformer_impl", "local") == "local" or not te_installed())


# after recompute: its checkpoint of GroupedMLP.forward then re-runs this feature's wrapper (the
# bf16 assertion bypass) in backward too; after megatron_args: inside its validate_args wrapper
FEATURE = feature(
    __name__,
    "--moe-permute-fusion and --moe-grouped-gemm without TransformerEngine/grouped_gemm",
    flag_needs=(
        FlagNeed("--moe-permute-fusion", when=_permute_fusion_needs_us,
                 because="upstream needs TransformerEngine for it"),
        FlagNeed("--moe-grouped-gemm", when=_grouped_gemm_needs_us,
                 because="upstream needs the grouped_gemm package (or TransformerEngine) for it"),
    ),
    after=("recompute", "megatron_args"),
    aliases=("moe_fusion",), kept_out=("fused_ops",))


@hookimpl
def mmp_register_patches(registry):
    from megatron_musa_patch.lib.ops import moe_permute

    def add(pid, target, kind, impl, condition, why, **extra):
        registry.add(FEATURE.patch(pid, target, kind, impl, condition=condition,
                                   why=why, **extra))

    for name in TE_FUSED:
        add(name, f"{MOE_UTILS}:{name}", "attribute", getattr(moe_permute, name), _without_te,
            "--moe-permute-fusion: TE-style fused permute from ops.moe_permute", create=True)
    add("permute", f"{MOE_UTILS}:permute", "wrap", _permute, _without_te,
        "--moe-permute-fusion: fused=True permute through ops.moe_permute")
    add("unpermute", f"{MOE_UTILS}:unpermute", "wrap", _unpermute, _without_te,
        "--moe-permute-fusion: fused=True unpermute through ops.moe_permute")
    add("sort_chunks", f"{MOE_UTILS}:sort_chunks_by_idxs", "wrap", _sort_chunks, _without_te,
        "--moe-permute-fusion: fused=True chunk sort through ops.moe_permute")
    # the local spec's grouped-GEMM experts (GroupedMLP and its glue exist before 0.17 only)
    for name, value in (("grouped_gemm", _GroupedGemmPackage()),
                        ("ops", _GroupedGemmPackage.ops)):
        registry.extend(FEATURE.patches_at(
            "grouped_gemm_util", f"grouped_gemm_{'ops' if name == 'ops' else 'package'}",
            "attribute", value, condition=_without_grouped_gemm, create=True,
            attribute=name, why="--moe-grouped-gemm: gmm from ops.grouped_gemm"))
    registry.extend(
        FEATURE.patches_at(
            "grouped_mlp_forward",
            "grouped_mlp_dtype",
            "wrap",
            _grouped_mlp_forward,
            condition=_without_grouped_gemm,
            why="GroupedMLP's bf16-only assertion is the package's; ops.grouped_gemm runs any dtype",
        )
    )
    add("capability_check", "megatron.training.arguments:validate_args", "wrap",
        _validate_args, _without_grouped_gemm,
        "--moe-grouped-gemm passes Megatron-LM's CUDA compute-capability assertion")


class _GroupedGemmOps:
    @staticmethod
    def gmm(a, b, batch_sizes, trans_b=False):
        from megatron_musa_patch.lib.ops.grouped_gemm import gmm

        return gmm(a, b, batch_sizes, trans_b=trans_b)

    @staticmethod
    def gmm_backward(a, b, batch_sizes, trans_b, grad):
        """The gradients of ``gmm`` without its forward, bit for bit autograd's: offered to
        ``--recompute-variance``, which skips the grouped experts' fc2 in the recompute (the
        grouped_gemm package has no such entry, so there the combination is refused)."""
        from megatron_musa_patch.lib.ops.grouped_gemm import gmm_backward

        return gmm_backward(a, b, batch_sizes, trans_b, grad)


class _GroupedGemmPackage:
    """Stands in for ``import grouped_gemm`` in megatron-core's ``grouped_gemm_util``."""

    ops = _GroupedGemmOps()


# ----------------------------------------------------------------------------- validation

@hookimpl(trylast=True)
def mmp_validate_args(args):
    # trylast: every other plugin checks the flags as given before --moe-grouped-gemm is hidden.
    # reached only with this feature usable (its flag_needs refuse the flags otherwise)
    if _grouped_gemm_needs_us(args) and _capability_major() < 8:
        # Megatron-LM asserts a CUDA compute capability >= 8 for the grouped_gemm package's
        # kernel; ops.grouped_gemm has no such need. Restored by _validate_args.
        args.moe_grouped_gemm = False
        setattr(args, _HIDDEN, True)


def _capability_major() -> int:
    import torch

    try:
        return int(torch.cuda.get_device_capability()[0])
    except Exception:  # noqa: BLE001 - no device API: the check cannot pass either
        return 0


def _validate_args(wrapped, instance, args, kwargs):
    margs = call_arguments(wrapped, args, kwargs).get("args")
    try:
        return wrapped(*args, **kwargs)
    finally:
        if margs is not None and getattr(margs, _HIDDEN, False):
            margs.moe_grouped_gemm = True
            delattr(margs, _HIDDEN)


# ----------------------------------------------------------------------------- call sites

def _permute(wrapped, instance, args, kwargs):
    a = call_arguments(wrapped, args, kwargs)
    if not a["fused"] or a.get("align_size", 0) > 0:
        return wrapped(*args, **kwargs)  # padding to an fp8/fp4 alignment: TE's kernel alone
    from megatron_musa_patch.lib.ops import moe_permute

    permuted, probs, sorted_indices = moe_permute.permute(
        a["tokens"], a["routing_map"], probs=a["probs"], num_out_tokens=a["num_out_tokens"],
        drop_and_pad=a["drop_and_pad"])
    if "tokens_per_expert" not in a:
        return permuted, probs, sorted_indices
    # the releases whose permute takes tokens_per_expert also return pad offsets and counts
    return permuted, probs, sorted_indices, None, a["tokens_per_expert"]


def _unpermute(wrapped, instance, args, kwargs):
    a = call_arguments(wrapped, args, kwargs)
    if not a["fused"] or a.get("pad_offsets") is not None:
        return wrapped(*args, **kwargs)
    from megatron_musa_patch.lib.ops import moe_permute

    return moe_permute.unpermute(a["permuted_tokens"], a["sorted_indices"], a["restore_shape"],
                                 probs=a["probs"])


def _sort_chunks(wrapped, instance, args, kwargs):
    a = call_arguments(wrapped, args, kwargs)
    if not a["fused"]:
        return wrapped(*args, **kwargs)
    from megatron_musa_patch.lib.ops import moe_permute

    return moe_permute.sort_chunks_by_index(a["input"], a["split_sizes"], a["sorted_idxs"],
                                            probs=a["probs"])


def _grouped_mlp_forward(wrapped, instance, args, kwargs):
    config = instance.config
    if config.bf16:
        return wrapped(*args, **kwargs)
    # upstream asserts bf16 for the package's kernel; ours computes in the input dtype
    instance.config = copy.copy(config)
    instance.config.bf16 = True
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.config = config
