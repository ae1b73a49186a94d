"""Megatron-LM's start-up steps that assume a CUDA toolchain.

* ``_compile_dependencies`` runs ``make`` for the dataset helpers: skipped when the compiled
  helpers already import (pip's megatron-core ships them).
* ``megatron.legacy.fused_kernels.load`` runs ``nvcc -V``: nothing to load off CUDA.
* ``_warmup_jit_function`` exists to trigger compilation; with an eager ``@jit_fuser`` it only
  costs time.
* ``initialize.py`` imports ``batch_invariant_kernels``, which imports triton at module level
  (0.16): without triton a stand-in module is served whose ``enable_batch_invariant_mode``
  (and ``set_batch_invariant_mode(True)``, which upstream's tests use) explains that
  ``--batch-invariant-mode`` needs triton.
* From 0.18 ``import megatron.core`` imports the MoE paged stash's triton kernels: without triton
  that module is executed with triton stand-ins (``triton_free``), so its kernels explain, if
  ``--moe-paged-stash`` ever launches them, that they need triton.

The CUDA assertion, ``set_device`` and the ``device_count() == 0`` gates of ``initialize.py``
need no patch of their own: the device swap makes ``torch.cuda`` answer for the device.
"""

from __future__ import annotations

import contextlib

from megatron_musa_patch.upstream.conditions import importable, missing
from megatron_musa_patch.base.errors import UnsupportedOnDeviceError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.triton_free import execute_without_triton
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import OFF_CUDA

FEATURE = feature(
    __name__,
    "Megatron-LM start-up without make, nvcc or triton where they are not needed",
    required=True,
    aliases=("cuda_free_startup",))


BATCH_INVARIANT = "megatron.core.transformer.custom_layers.batch_invariant_kernels"  # for messages


@hookimpl
def mmp_register_patches(session, registry, device):
    eager = device.jit_mode(session.settings.jit) == "eager"
    registry.add(FEATURE.patch(
        "compile_helpers", "megatron.core.datasets.utils:compile_helpers", "wrap",
        _compile_helpers_if_missing,
        why="skip `make` when the compiled dataset helpers already import"))
    registry.extend(FEATURE.patches_at(
        "legacy_fused_kernels_load", "fused_kernels_load", "replace",
        _no_fused_kernels, devices=OFF_CUDA,
        why="legacy fused kernels are CUDA-only (nvcc); nothing to build off CUDA"))
    registry.add(FEATURE.patch(
        "jit_warmup", "megatron.training.initialize:_warmup_jit_function",
        "replace", _no_jit_warmup,
        condition=lambda: eager or "@jit_fuser compiles here: the warm-up compiles its kernels",
        why="@jit_fuser is eager here: the warm-up would compile nothing"))
    registry.extend(FEATURE.patches_at(
        "batch_invariant_kernels", "batch_invariant_stand_in", "module",
        _batch_invariant_stand_in, condition=lambda: missing("triton"),
        why="triton is not installed: --batch-invariant-mode raises a clear error instead of "
            "initialize.py failing to import"))
    registry.extend(FEATURE.patches_at(
        "paged_stash_kernels", "paged_stash_without_triton", "module",
        _paged_stash_without_triton, condition=lambda: missing("triton"),
        why="triton is not installed: `import megatron.core` works; --moe-paged-stash "
            "explains that its kernels need triton"))
    registry.add(FEATURE.patch(
        "inference_tensor_ops_without_triton",
        "megatron.core.inference.contexts.attention_context.triton.tensor_ops:*", "module",
        _inference_tensor_ops_without_triton, condition=lambda: missing("triton"),
        why="triton is not installed: upstream's inference scripts import it through the Mamba "
            "builders (0.16-0.17's gpt_static_inference.py); the kernels explain that they "
            "need triton"))


def _compile_helpers_if_missing(wrapped, instance, args, kwargs):
    if importable("megatron.core.datasets.helpers_cpp"):
        return None
    return wrapped(*args, **kwargs)


def _no_fused_kernels(args=None):
    return None


def _no_jit_warmup(*args, **kwargs):  # upstream's parameters vary by release
    return None


def _paged_stash_without_triton(module):
    execute_without_triton(module, "the MoE paged stash (--moe-paged-stash)")


def _inference_tensor_ops_without_triton(module):
    execute_without_triton(module, "the dynamic inference context's tensor ops")


def _batch_invariant_stand_in(module):
    def enable_batch_invariant_mode(*args, **kwargs):
        raise UnsupportedOnDeviceError(
            "--batch-invariant-mode needs Megatron's triton kernels "
            f"({BATCH_INVARIANT}), and triton is not installed. Install triton for your "
            "device, or remove --batch-invariant-mode."
        )

    def is_batch_invariant_mode_enabled():
        return False

    def disable_batch_invariant_mode():  # never enabled here: nothing to restore
        return None

    @contextlib.contextmanager
    def set_batch_invariant_mode(enabled: bool = True):
        if enabled:
            enable_batch_invariant_mode()
        yield

    module.enable_batch_invariant_mode = enable_batch_invariant_mode
    module.is_batch_invariant_mode_enabled = is_batch_invariant_mode_enabled
    module.disable_batch_invariant_mode = disable_batch_invariant_mode
    module.set_batch_invariant_mode = set_batch_invariant_mode
