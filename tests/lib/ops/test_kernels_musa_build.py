"""How csrc/ is built for MUSA, tested without a MUSA toolchain: the build configuration each
route generates, recorded by the stand-in ``torch_musa.utils.musa_extension``.

The route kept is torch_musa's own builders on one-line ``.mu`` wrappers (JIT:
``musa_extension.load``; ahead of time: setup.py's ``MUSAExtension``), with ``-DUSE_MUSA`` so the
portable sources take their MUSA branch. torchada's ``CUDAExtension`` route was measured and not
taken: it hands the ``.cu`` files and the nvcc flags to ``MUSAExtension`` unchanged, without
``-DUSE_MUSA``, and relies on its ``BuildExtension`` porting the sources *in place*; on these
sources the port changes nothing in the MUSA branch or the kernel units and rewrites the CUDA
branch to MUSA names, so a checkout built for MUSA would no longer build for CUDA.
"""

import json
import re
import shutil

import pytest

from megatron_musa_patch.lib.ops.kernels import sources

from tests.conftest import REPO, run_probe
from tests.device.musa_rows import MAPPINGS, musa_env, needs_torchada

CSRC = REPO / "csrc"


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_jit_build_uses_torch_musas_loader_on_mu_wrappers(mapping, tmp_path):
    proc = run_probe("tests.lib.ops.probes.musa_jit_build",
                     env=musa_env(mapping, TORCH_EXTENSIONS_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    call = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert call["adapter"] == {"torchada": "torchada", "builtin": "megatron_musa_patch"}[mapping]
    csrc = type(CSRC)(call["csrc"])  # the checkout's csrc/ or the installed copy
    assert call["call"] == "load" and call["name"].startswith("mmp_kernels_musa_")
    assert call["sources"][0] == str(csrc / sources.BINDING_SOURCE)
    stems = [s.rsplit("/", 1)[1] for s in call["sources"][1:]]
    assert stems == [k.replace(".cu", ".mu") for k in sources.KERNEL_SOURCES]
    for kernel in sources.KERNEL_SOURCES:
        assert call["wrappers"][kernel.replace(".cu", ".mu")] == f'#include "{csrc / kernel}"\n'
    assert call["extra_cflags"] == sources.CXX_FLAGS + ["-DUSE_MUSA"]
    assert call["extra_musa_cflags"] == sources.MCC_FLAGS
    assert call["extra_include_paths"] == [str(csrc / "include")]
    assert call["build_directory"].startswith(str(tmp_path))


def test_setup_py_builds_musa_through_musa_extension(tmp_path):
    # a copy of what setup.py reads, so the wrappers it writes stay out of the checkout
    for name in ("setup.py", "README.md", "megatron_musa_patch.pth"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "csrc", tmp_path / "csrc")
    shutil.copytree(REPO / "megatron_musa_patch", tmp_path / "megatron_musa_patch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # the copy first on sys.path (the current directory): setup.py and the package it imports
    proc = run_probe("tests.lib.ops.probes.musa_setup_py", cwd=tmp_path,
                     env=musa_env("builtin", MMP_BUILD_KERNELS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ext = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert ext["name"] == "megatron_musa_patch._kernels_musa"
    assert ext["sources"] == ["csrc/binding.cpp"] + [
        f"build/mmp_mu/{k.replace('.cu', '.mu')}" for k in sources.KERNEL_SOURCES]
    assert ext["kwargs"]["extra_compile_args"] == {"cxx": sources.CXX_FLAGS + ["-DUSE_MUSA"],
                                                   "mcc": sources.MCC_FLAGS}
    assert ext["build_ext"] == "torch_musa.utils.musa_extension"
    norm = (tmp_path / "build" / "mmp_mu" / "norm.mu").read_text()
    assert norm == f'#include "{tmp_path / "csrc" / "norm.cu"}"\n'


def test_musa_extra_pins_the_measured_torchada():
    from megatron_musa_patch.device import adapter

    text = (REPO / "setup.py").read_text()
    assert f'"musa": ["torchada=={adapter.TESTED_VERSION}"]' in text


def _branches(text):
    """(MUSA branch, CUDA branch) of the device-selecting #if in a portable source."""
    match = re.search(r"#if defined\((?:__MUSACC__\) \|\| defined\()?USE_MUSA\)\n(.*?)\n#else\n"
                      r"(.*?)\n#endif", text, re.S)
    assert match, "no device-selecting #if"
    return match.group(1), match.group(2)


@needs_torchada
def test_torchadas_cuda_extension_route_would_port_the_checkout_in_place():
    proc = run_probe("tests.lib.ops.probes.musa_torchada_cuda_extension",
                     env=musa_env("torchada", MEGATRON_MUSA_PATCH_AUTOACTIVATE="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    call = res["call"]
    # .cu handed over as they are, nvcc's flags under mcc, no -DUSE_MUSA for the binding
    assert call["call"] == "MUSAExtension" and call["sources"][1].endswith(".cu")
    assert call["extra_compile_args"] == {"cxx": sources.CXX_FLAGS, "mcc": sources.NVCC_FLAGS}
    for kernel in sources.KERNEL_SOURCES:
        assert res["ported"][kernel] == (CSRC / kernel).read_text(), kernel
    for name in (sources.BINDING_SOURCE, "include/mmp_device.h"):
        original, ported = (CSRC / name).read_text(), res["ported"][name]
        musa_branch, cuda_branch = _branches(original)
        ported_musa, ported_cuda = _branches(ported)
        assert ported_musa == musa_branch, f"{name}: the MUSA branch needs no porting"
        assert ported_cuda != cuda_branch and "musa" in ported_cuda.lower(), name
