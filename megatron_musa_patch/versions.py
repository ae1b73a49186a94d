"""Versions of what the layer patches, read without importing Megatron.

Patches are gated on these: ``megatron.core`` targets on the installed megatron-core, and
``megatron.training`` / ``megatron.legacy`` / script targets on the Megatron-LM checkout named
by ``MEGATRON_LM_PATH``.
"""

import functools
import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Optional

from packaging.version import InvalidVersion, Version

#: megatron-core releases every patch record was verified on
VERIFIED_MEGATRON = ">=0.16.1,<0.17"

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


_detected = {"lm_path": None}


def lm_path() -> Optional[Path]:
    """The Megatron-LM checkout: MEGATRON_LM_PATH, else one found on sys.path at activation."""
    value = os.environ.get("MEGATRON_LM_PATH", "").strip()
    return Path(value).expanduser().resolve() if value else _detected["lm_path"]


def set_detected_lm_path(path: Optional[Path]) -> None:
    _detected["lm_path"] = path


def megatron_lm_version(path: Optional[Path] = None) -> Optional[Version]:
    """Version of a Megatron-LM checkout, from its own ``megatron/core/package_info.py``."""
    path = path or lm_path()
    return None if path is None else _lm_version_at(path)


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


def version_for_target(module_name: str) -> Optional[Version]:
    """The version a patch on ``module_name`` is gated on."""
    if module_name.startswith("megatron.core") or not module_name.startswith("megatron."):
        return megatron_core_version()
    return megatron_lm_version() or megatron_core_version()


def summary() -> dict:
    """Versions shown by ``mmp doctor``."""
    lm = lm_path()
    return {
        "python": sys.version.split()[0],
        "torch": distribution_version("torch"),
        "torch_musa": distribution_version("torch_musa") or distribution_version("torch-musa"),
        "megatron-core": str(megatron_core_version()) if megatron_core_version() else None,
        "Megatron-LM": (
            f"{megatron_lm_version()} at {lm}" if lm and megatron_lm_version() else
            (f"not found at {lm}" if lm else "MEGATRON_LM_PATH not set")
        ),
        "transformer-engine": distribution_version("transformer-engine")
        or distribution_version("transformer_engine"),
        "megatron_musa_patch": distribution_version("megatron-musa-patch"),
    }
