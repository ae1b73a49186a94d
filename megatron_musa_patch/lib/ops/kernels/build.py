"""Just-in-time build of csrc/ (nvcc through torch.utils.cpp_extension, mcc through
torch_musa's musa_extension), cached per source hash so an edited source is rebuilt, never
mixed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .sources import (BINDING_SOURCE, CXX_FLAGS, HEADERS, KERNEL_SOURCES, MCC_FLAGS, NVCC_FLAGS,
                      csrc_dir, write_mu_wrappers)


def source_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for rel in (BINDING_SOURCE, *KERNEL_SOURCES, *HEADERS):
        digest.update(rel.encode())
        digest.update((root / rel).read_bytes())
    return digest.hexdigest()[:10]


def build_root() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        try:
            from torch.utils.cpp_extension import get_default_build_root

            root = get_default_build_root()
        except Exception:  # noqa: BLE001
            root = os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    return Path(root) / "mmp"


def extension_name(device_type: str) -> str:
    root = csrc_dir()
    return f"mmp_kernels_{device_type}_{source_hash(root) if root else 'nosrc'}"


def build_dir(device_type: str) -> Path:
    try:
        return build_root() / extension_name(device_type)
    except Exception:  # noqa: BLE001
        return build_root()


def build(device_type: str):
    root = csrc_dir()
    name = extension_name(device_type)
    directory = build_root() / name
    directory.mkdir(parents=True, exist_ok=True)
    include = [str(root / "include")]
    verbose = os.environ.get("MMP_KERNELS_VERBOSE", "") == "1"
    if device_type == "cuda":
        from torch.utils.cpp_extension import load

        sources = [str(root / BINDING_SOURCE)] + [str(root / s) for s in KERNEL_SOURCES]
        return load(name=name, sources=sources, extra_include_paths=include, extra_cflags=CXX_FLAGS,
                    extra_cuda_cflags=NVCC_FLAGS, build_directory=str(directory), verbose=verbose)
    from torch_musa.utils import musa_extension

    # torch_musa's own loader, not torchada's ported CUDAExtension route: the sources are
    # portable already (see sources.write_mu_wrappers and docs/features/fused-ops.md)
    sources = [str(root / BINDING_SOURCE)] + write_mu_wrappers(root, directory / "mu")
    return musa_extension.load(name=name, sources=sources, extra_include_paths=include,
                               extra_cflags=CXX_FLAGS + ["-DUSE_MUSA"], extra_musa_cflags=MCC_FLAGS,
                               build_directory=str(directory), verbose=verbose)
