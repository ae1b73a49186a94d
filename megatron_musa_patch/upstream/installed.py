"""Versions of what the layer patches, read without importing Megatron or torch.

Patches are gated on these: ``megatron.core`` targets on the installed megatron-core,
``megatron.training`` / ``megatron.legacy`` / script targets on the Megatron-LM checkout the
session found (``MEGATRON_LM_PATH``, or one on ``sys.path``), and torch ranges on the installed
torch. The checkout is passed in: this module keeps no state of its own.
"""

import functools
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from typing import Optional

from packaging.version import InvalidVersion, Version

from . import ranges, tables

_VERSION_FIELDS = re.compile(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*(.+)$", re.M)


def distribution_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def megatron_core_version() -> Optional[Version]:
    """The megatron-core that ``import megatron.core`` will load (pip's, see ``lm_path``)."""
    text = distribution_version("megatron-core") or distribution_version("megatron_core")
    if text is None:
        spec = importlib.util.find_spec("megatron.core") if _has_megatron_namespace() else None
        if spec is None or spec.origin is None:
            return None
        text = _version_from_package_info(Path(spec.origin).parent / "package_info.py")
    return _parse(text)


def _has_megatron_namespace() -> bool:
    try:
        return importlib.util.find_spec("megatron") is not None
    except (ImportError, ValueError):
        return False


def megatron_lm_version(path: Optional[Path]) -> Optional[Version]:
    """Version of a Megatron-LM checkout, from its own ``megatron/core/package_info.py``."""
    return None if path is None else _lm_version_at(Path(path))


@functools.lru_cache(maxsize=None)
def _lm_version_at(path: Path) -> Optional[Version]:
    return _parse(_version_from_package_info(path / "megatron" / "core" / "package_info.py"))


def _version_from_package_info(path: Path) -> Optional[str]:
    try:
        text = path.read_text()
    except OSError:
        return None
    fields = {k: v.strip().strip("'\"") for k, v in _VERSION_FIELDS.findall(text)}
    if not {"MAJOR", "MINOR", "PATCH"} <= fields.keys():
        return None
    return f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}{fields.get('PRE_RELEASE', '')}"


def _parse(text: Optional[str]) -> Optional[Version]:
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


def torch_version() -> Optional[Version]:
    """The torch this process runs: the imported module's own version where torch is imported
    (a source build on PYTHONPATH has no distribution), else the installed distribution's."""
    module = sys.modules.get("torch")
    return _parse(getattr(module, "__version__", None) or distribution_version("torch"))


def torch_musa_version() -> Optional[str]:
    """The installed torch_musa distribution (not imported: a torch_musa built on another torch
    may fail, or crash, on import)."""
    return distribution_version("torch_musa") or distribution_version("torch-musa")


def version_for_target(module_name: str, lm_path: Optional[Path]) -> Optional[Version]:
    """The version a patch on ``module_name`` is gated on: megatron-core's for its own modules
    and, from 0.17 on, for ``megatron.training`` too (the wheel ships it); the Megatron-LM
    checkout's for ``megatron.training`` of 0.16 and for the other ``megatron.*`` packages."""
    core = megatron_core_version()
    if module_name.startswith("megatron.core") or not module_name.startswith("megatron."):
        return core
    release = ranges.row_of(tables.MEGATRON, core)
    if module_name.startswith("megatron.training") and release is not None and \
            release.training_from == "wheel":
        return core
    return megatron_lm_version(lm_path) or core


def gating_distribution(module_name: str) -> str:
    """The name of what ``version_for_target`` reads for ``module_name`` (for messages)."""
    if module_name.startswith("megatron.core") or not module_name.startswith("megatron."):
        return "megatron-core"
    release = ranges.row_of(tables.MEGATRON, megatron_core_version())
    if module_name.startswith("megatron.training") and release is not None and \
            release.training_from == "wheel":
        return "megatron-core"
    return "Megatron-LM"


def summary(lm: Optional[Path]) -> dict:
    """Versions shown by ``mmp doctor``."""
    return {
        "python": sys.version.split()[0],
        "torch": str(torch_version()) if torch_version() else None,
        "torch_musa": torch_musa_version(),
        # Moore Threads' CUDA-to-MUSA adapter: the musa row's torch mapping (installed is not
        # imported: mmp doctor's "torch mapping" line says whether it is in use)
        "torchada": distribution_version("torchada"),
        "megatron-core": str(megatron_core_version()) if megatron_core_version() else None,
        "Megatron-LM": (
            f"{megatron_lm_version(lm)} at {lm}" if lm and megatron_lm_version(lm) else
            (f"not found at {lm}" if lm else "MEGATRON_LM_PATH not set")
        ),
        "transformer-engine": distribution_version("transformer-engine")
        or distribution_version("transformer_engine"),
        "megatron_musa_patch": distribution_version("megatron-musa-patch"),
    }
