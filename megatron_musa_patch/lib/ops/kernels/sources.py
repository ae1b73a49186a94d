"""Where the kernel sources are and how they are compiled (setup.py reads this file by path
for its ahead-of-time build, so it imports nothing but the standard library)."""

from pathlib import Path
from typing import List, Optional

PACKAGE_DIR = Path(__file__).resolve().parents[3]
# source checkout: <repo>/csrc; installed wheel/sdist: megatron_musa_patch/csrc (package data)
_CSRC_CANDIDATES = (PACKAGE_DIR.parent / "csrc", PACKAGE_DIR / "csrc")
KERNEL_SOURCES = ("norm.cu", "swiglu.cu", "rope.cu", "permute.cu")
BINDING_SOURCE = "binding.cpp"
HEADERS = ("include/mmp_device.h", "include/mmp_kernels.h")

# Flags shared by the JIT and the setup.py builds. No fast-math: RoPE needs accurate sincosf.
# No -std: torch's and torch_musa's builders add the standard their headers need (the sources
# need C++17 or later).
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr"]
MCC_FLAGS = ["-O3", "-DUSE_MUSA"]


def write_mu_wrappers(root: Path, out_dir: Path) -> List[str]:
    """The MUSA build's kernel sources: one ``.mu`` per kernel unit, each a single ``#include``
    of the ``.cu`` (torch_musa's builders compile ``.mu`` with mcc; the sources are portable, so
    nothing is ported or rewritten). Used by the JIT build and by setup.py alike."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wrappers = []
    for src in KERNEL_SOURCES:
        wrapper = out_dir / (Path(src).stem + ".mu")
        text = f'#include "{Path(root) / src}"\n'
        if not wrapper.is_file() or wrapper.read_text() != text:
            wrapper.write_text(text)
        wrappers.append(str(wrapper))
    return wrappers


def csrc_dir() -> Optional[Path]:
    """The directory holding the kernel sources, or None when they are not shipped."""
    for path in _CSRC_CANDIDATES:
        if (path / BINDING_SOURCE).is_file():
            return path
    return None
