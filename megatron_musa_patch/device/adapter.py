"""Who maps torch's CUDA spellings: torchada on the musa row, or the layer's built-in mapping.

On the musa row the torch-level mapping is Moore Threads' torchada (the ``musa`` extra); the
layer keeps only the records torchada leaves (``torchada_coverage``) and what is Megatron's
business. ``MEGATRON_MUSA_PATCH_TORCHADA=0`` keeps the built-in mapping there. The cpu and cuda
rows never import torchada: its import writes into its own site-packages directory and sets
environment variables even where it maps nothing.

Order, whoever imports torchada:

* the layer imports it (``torchada_import.preload``, before torch where the user has not imported
  it, before torch_musa is imported for device selection, before any record is built) with
  ``TORCHADA_FORCE_CUDA_AVAILABLE=1`` unless the user set it, because Megatron asserts
  ``torch.cuda.is_available()``;
* imported by the user before the layer: the same state (a gap record covers ``is_available``
  if it stayed False);
* imported by the user after the layer: already imported, nothing happens.

Each torch name is then patched by one adapter: where torchada patched a name without what
Megatron needs (``Tensor.cuda``'s memory_format, compound backend strings), the layer's record
takes its place over torch's own object, never on top of torchada's. In built-in mode a later
``import torchada`` that would map MUSA is refused (``device.torchada_guard``), since it would
patch the names a second time.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Iterable, Optional

from megatron_musa_patch.upstream import conditions
from megatron_musa_patch.base.errors import TorchMappingError
from megatron_musa_patch.core.settings import PREFIX, TORCHADA_PLATFORM_ENV
from .torchada_import import (EXTRA, MODULE, SWITCH, TESTED_VERSION, import_now, would_map_musa)
from megatron_musa_patch.upstream import installed
from . import torchada_coverage

#: reasons in the patch table start with these, so mmp doctor can count who maps what
MAPPED_BY = "mapped by torchada"
LEFT_BY = "torchada leaves this"


def installed_version() -> Optional[str]:
    return installed.distribution_version(MODULE)


def choose(settings, device, imported_by_layer: bool):
    """The mapping for the selected ``device`` row; raises where torchada and the row disagree."""
    present = MODULE in sys.modules
    mapped = present and torchada_coverage.redirects_torch_cuda()
    version = installed_version()
    if device.name != "musa":
        if mapped:
            how = "imported because torch_musa is installed" if imported_by_layer else "imported"
            raise TorchMappingError(
                f"torchada {version} ({how}) has mapped torch.cuda to torch.musa, but the layer "
                f"runs on the {device.name} row (no usable MUSA device here, or "
                f"{PREFIX}_DEVICE={settings.device}). Set {PREFIX}_DEVICE={device.name} "
                f"explicitly (the layer then does not import torchada), do not import torchada, "
                f"or set {TORCHADA_PLATFORM_ENV}={device.name if device.name == 'cpu' else 'cuda'}"
                f" before it is imported.")
        return BuiltinMapping(device.name, refuse_later=would_map_musa(settings))
    if not settings.torchada:
        if mapped:
            raise TorchMappingError(
                f"{SWITCH}=0 asks for the layer's built-in torch mapping, but torchada {version} "
                f"was imported before the layer and has already mapped torch.cuda to torch.musa; "
                f"two adapters would patch the same torch names. Remove the `import torchada`, "
                f"or unset {SWITCH} to let torchada map torch.")
        return BuiltinMapping(device.name, refuse_later=would_map_musa(settings))
    if not present:
        if not conditions.importable(MODULE):
            raise TorchMappingError(
                f"the musa row maps torch through torchada, which is not installed. Install the "
                f"musa extra ({EXTRA}, which brings torchada=={TESTED_VERSION}), or set "
                f"{SWITCH}=0 to use the layer's built-in mapping.")
        import_now(settings)
        imported_by_layer = True
    if not torchada_coverage.redirects_torch_cuda():
        raise TorchMappingError(
            f"torchada {version} is imported but did not map torch.cuda to torch.musa "
            f"({TORCHADA_PLATFORM_ENV}={settings.torchada_platform or '(unset)'}; it maps only "
            f"where it detects MUSA). Unset {TORCHADA_PLATFORM_ENV} (or set it to musa), or set "
            f"{SWITCH}=0 to use the layer's built-in mapping.")
    origin = "imported by the layer" if imported_by_layer else "imported before the layer"
    return TorchadaMapping(device.name, device.torch_type, version, origin)


# ----------------------------------------------------------------------------- the mappings


def _torch_level(patch, row: str) -> bool:
    return patch.for_device(row) and patch.module.split(".")[0] == "torch"


@dataclasses.dataclass(frozen=True)
class BuiltinMapping:
    """The layer maps torch itself (cpu row, cuda row's nothing, musa with TORCHADA=0)."""

    row: str
    #: a later ``import torchada`` would map MUSA a second time: refuse it
    refuse_later: bool = False
    adapter: str = "megatron_musa_patch"

    def arbitrate(self, patches: Iterable[Any]) -> Iterable[Any]:
        return patches

    def guard_condition(self) -> Callable[[], Any]:
        refuse = self.refuse_later
        return lambda: True if refuse else "torchada would map nothing here (no torch_musa)"

    def describe(self, results=()) -> str:
        tada = installed_version()
        if self.row == "musa":
            return (f"built-in (megatron_musa_patch), {SWITCH}=0"
                    + (f"; torchada {tada} installed, not imported" if tada else ""))
        return ("built-in (megatron_musa_patch)" +
                (f"; torchada {tada} installed, used on the musa row only" if tada else ""))


@dataclasses.dataclass(frozen=True)
class TorchadaMapping:
    """torchada maps torch on the musa row; the layer's torch-level records fill its gaps."""

    row: str
    torch_type: str
    version: Optional[str]
    origin: str
    adapter: str = "torchada"

    def arbitrate(self, patches: Iterable[Any]) -> Iterable[Any]:
        """Each torch-level record: skipped where torchada maps its target, kept (with the gap
        as its reason) where it does not. Megatron-level records pass unchanged."""
        for patch in patches:
            if not _torch_level(patch, self.row):
                yield patch
                continue
            mapped = torchada_coverage.covers(patch.target, self.torch_type)
            if mapped is not None:
                reason = f"{MAPPED_BY} {self.version}: {mapped}"
                yield dataclasses.replace(patch, condition=lambda reason=reason: reason)
            else:
                gap = torchada_coverage.gap(patch.target, self.torch_type)
                yield dataclasses.replace(patch, why=f"{LEFT_BY} ({self.version}): {gap}")

    def guard_condition(self) -> Callable[[], Any]:
        return lambda: "torchada is this row's torch mapping"

    def describe(self, results=()) -> str:
        results = list(results)
        by_tada = sum(r.status == "skipped" and r.reason.startswith(MAPPED_BY) for r in results)
        ours = sum(r.status == "applied" and r.reason.startswith(LEFT_BY) for r in results)
        tested = "" if self.version == TESTED_VERSION else f", tested with {TESTED_VERSION}"
        return (f"torchada {self.version} ({self.origin}{tested}): {by_tada} of the layer's "
                f"torch-level records are torchada's; megatron_musa_patch keeps {ours} it leaves")
