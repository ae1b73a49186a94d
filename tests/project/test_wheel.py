"""The release artefact: the wheel builds from the checkout and carries what an install needs
(the start-up hook and its .pth at the root of site-packages, the kernel sources for first-use
builds, the version), without the repository's tests, tools or benchmarks."""

import subprocess
import sys
import zipfile

from megatron_musa_patch.base.version import __version__

from tests.conftest import REPO


def test_the_wheel_builds_and_carries_the_hook(tmp_path):
    # no isolation: setuptools and wheel come with the test environment (no download)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("megatron_musa_patch-*.whl")
    assert f"-{__version__}-" in wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("megatron_musa_patch.pth", "_megatron_musa_patch_boot.py",
                   "megatron_musa_patch/__init__.py", "megatron_musa_patch/base/version.py",
                   "megatron_musa_patch/features/fused_ops/rope.py",
                   "megatron_musa_patch/csrc/binding.cpp"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "tools/", "benchmarks/"))]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert f"Version: {__version__}" in text and "License" in text
