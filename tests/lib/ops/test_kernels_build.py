"""csrc/ kernels: the sources compile with a real nvcc, and the loader degrades cleanly.

The compile checks need nvcc (any CUDA toolkit; no GPU, no CUDA torch): each kernel unit is
compiled to object code for sm_80 and sm_90 with the flags torch's extension build adds, and
must compile without warnings or register spills. The torch binding is compiled (syntax only)
against this torch's headers when they and the CUDA headers are present. Without nvcc the
tests skip saying so (CI has none). Numerics on a device are tests/lib/ops/test_kernels_gpu.py.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from megatron_musa_patch.lib.ops import kernels

from tests.conftest import run_probe

REPO = Path(__file__).resolve().parents[3]
CSRC = REPO / "csrc"
ARCHS = ("80", "90")
SPILL_LIMIT = 16  # bytes of spill stores tolerated per kernel (see check_compiled)
# what torch.utils.cpp_extension passes to nvcc (COMMON_NVCC_FLAGS), so the check matches a build
TORCH_NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr"]


def _cuda_homes():
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [h for h in homes if h] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)


def find_nvcc():
    # toolkit directories first (PATH may hold a wrapper script far from the headers)
    candidates = [os.path.join(home, "bin", "nvcc") for home in _cuda_homes()] + [shutil.which("nvcc")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def find_cuda_include():
    homes = [str(Path(NVCC).resolve().parents[1])] + _cuda_homes()
    for home in homes:
        if os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h")):
            return Path(home) / "include"
    return None


NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (PATH, CUDA_HOME, "
                                "/usr/local/cuda*): the csrc compile check needs a CUDA toolkit")


def nvcc_compile(source: Path, out_dir: Path, extra=(), archs=ARCHS):
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    cmd = [NVCC, "-c", str(source), "-o", str(out_dir / (source.stem + ".o")), "-O3", "-std=c++17",
           f"-I{CSRC / 'include'}", "-Xptxas", "-v", "-Xcompiler", "-Wall,-Wextra",
           *TORCH_NVCC_FLAGS, *gencode, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return cmd, proc


def check_compiled(source, cmd, proc):
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{source.name} failed to compile:\n{' '.join(cmd)}\n{log[-4000:]}"
    warnings = [line for line in log.splitlines() if "warning" in line.lower()]
    assert not warnings, f"{source.name}: compiler warnings:\n" + "\n".join(warnings[:20])
    # A few bytes of "spill" come with calls into the math library's slow paths (sincosf's
    # argument reduction, expf); tens of bytes and more mean register pressure.
    spills = [line for line in log.splitlines()
              if (m := re.search(r"(\d+) bytes spill stores", line)) and int(m.group(1)) > SPILL_LIMIT]
    assert not spills, f"{source.name}: register spills:\n" + "\n".join(spills[:20])


def test_every_kernel_source_is_checked():
    on_disk = sorted(p.name for p in CSRC.glob("*.cu"))
    assert on_disk == sorted(kernels.KERNEL_SOURCES)
    assert (CSRC / kernels.BINDING_SOURCE).is_file()
    assert kernels.csrc_dir() == CSRC


@pytest.mark.slow
@needs_nvcc
def test_kernels_compile_with_nvcc(tmp_path):
    sources = [CSRC / name for name in kernels.KERNEL_SOURCES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: nvcc_compile(s, tmp_path), sources))
    for source, (cmd, proc) in zip(sources, results):
        check_compiled(source, cmd, proc)
        assert (tmp_path / (source.stem + ".o")).stat().st_size > 0


@pytest.mark.slow
@needs_nvcc
def test_musa_code_path_compiles_through_stub_headers(tmp_path):
    """The USE_MUSA branch of mmp_device.h (musa* runtime names, the shared-memory block
    reduction) compiled by nvcc, with stub musa headers that alias the CUDA ones. A syntax and
    type check of that branch only: it is not an mcc build."""
    stub = tmp_path / "musa_stub"
    stub.mkdir()
    (stub / "musa_runtime.h").write_text(
        "#pragma once\n#include <cuda_runtime.h>\n"
        "typedef cudaStream_t musaStream_t;\ntypedef cudaError_t musaError_t;\n"
        "#define musaSuccess cudaSuccess\n#define musaErrorInvalidValue cudaErrorInvalidValue\n"
        "#define musaGetLastError cudaGetLastError\n#define musaGetErrorString cudaGetErrorString\n"
        "#define musaGetDevice cudaGetDevice\n#define musaDeviceGetAttribute cudaDeviceGetAttribute\n"
        "#define musaDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount\n")
    (stub / "musa_fp16.h").write_text("#pragma once\n#include <cuda_fp16.h>\n")
    (stub / "musa_bf16.h").write_text("#pragma once\n#include <cuda_bf16.h>\n"
                                      "typedef __nv_bfloat16 __mt_bfloat16;\n")
    out = tmp_path / "obj"
    out.mkdir()
    sources = [CSRC / name for name in kernels.KERNEL_SOURCES]
    extra = ["-DUSE_MUSA", f"-I{stub}"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: nvcc_compile(s, out, extra, archs=ARCHS[-1:]), sources))
    for source, (cmd, proc) in zip(sources, results):
        check_compiled(source, cmd, proc)


def _binding_include_dirs(tmp_path):
    torch_include = Path(sysconfig.get_paths()["purelib"]) / "torch" / "include"
    try:
        import torch.utils.cpp_extension as cpp

        torch_include = Path(cpp.include_paths()[0])
    except Exception:  # noqa: BLE001
        pass
    cuda_include = find_cuda_include()
    if not (torch_include / "c10" / "cuda" / "CUDAStream.h").is_file():
        pytest.skip(f"{torch_include} has no c10/cuda headers")
    if cuda_include is None:
        pytest.skip(f"no CUDA include directory with cuda_runtime_api.h next to {NVCC}")
    dirs = [torch_include, torch_include / "torch" / "csrc" / "api" / "include", cuda_include,
            Path(sysconfig.get_paths()["include"])]
    if not (torch_include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file():
        # generated at torch build time and absent from CPU wheels; its only content
        stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
        stub.mkdir(parents=True)
        (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        dirs.append(tmp_path / "stub")
    return dirs


@pytest.mark.slow
@needs_nvcc
def _torch_cxx_standard() -> str:
    """The C++ standard the installed torch's headers demand (torch 2.13 and later: C++20, which
    they check for; earlier: C++17), as torch.utils.cpp_extension passes it."""
    import torch

    aten = Path(torch.__file__).parent / "include" / "ATen" / "ATen.h"
    return "c++20" if "202002L" in aten.read_text() else "c++17"


def test_binding_compiles_against_torch_headers(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    dirs = _binding_include_dirs(tmp_path)
    cmd = [cxx, f"-std={_torch_cxx_standard()}", "-fsyntax-only", "-Wall", "-Wextra",
           f"-I{CSRC / 'include'}",
           *[f"-isystem{d}" for d in dirs], "-DTORCH_EXTENSION_NAME=mmp_kernels_check",
           "-DTORCH_API_INCLUDE_EXTENSION_H", str(CSRC / kernels.BINDING_SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"binding.cpp failed to compile:\n{' '.join(cmd)}\n{log[-4000:]}"
    assert "warning" not in log.lower(), log[-4000:]


# ---- the loader: never raises, says why -------------------------------------------------------


@pytest.fixture
def fresh_kernels():
    kernels.reset()
    yield kernels
    kernels.reset()


def test_cpu_has_no_compiled_kernels_and_says_why(fresh_kernels):
    for op in kernels.OPS:
        assert fresh_kernels.available(op, "cpu") is False
    assert "no compiled kernels" in fresh_kernels.status("cpu")
    with pytest.raises(RuntimeError, match="unavailable on cpu"):
        fresh_kernels.get("rms_norm_fwd", "cpu")


def test_cuda_and_musa_report_a_reason_without_a_device(fresh_kernels):
    import torch

    if torch.version.cuda and kernels.toolchain.cuda_device_count(torch):
        pytest.skip("this machine has a CUDA device: the loader would build the kernels")
    assert fresh_kernels.available("rms_norm_fwd", "cuda") is False
    assert re.search(r"cuda: unavailable: .+", fresh_kernels.status("cuda"))
    if not kernels.toolchain.torch_musa_importable():
        assert fresh_kernels.available("permute", "musa") is False
        assert "torch_musa cannot be imported" in fresh_kernels.status("musa")


def test_device_names_are_normalised(fresh_kernels):
    import torch

    assert fresh_kernels.available("rms_norm_fwd", torch.device("cpu")) is False
    assert fresh_kernels.status("cpu:0").startswith("cpu: unavailable")
    assert kernels.device_type_name(torch.device("cuda", 1)) == "cuda"
    assert kernels.device_type_name("musa:0") == "musa"


def test_unknown_ops_and_devices(fresh_kernels):
    assert fresh_kernels.available("no_such_op", "cuda") is False
    assert fresh_kernels.available("rms_norm_fwd", "xpu") is False
    assert fresh_kernels.available(None, None) is False
    with pytest.raises(KeyError, match="no_such_op"):
        fresh_kernels.get("no_such_op")


def test_available_never_raises(fresh_kernels, monkeypatch):
    def broken(device_type):
        raise OSError("disk on fire")

    monkeypatch.setattr(kernels, "_load", broken)
    assert fresh_kernels.available("rms_norm_fwd", "cuda") is False
    monkeypatch.setattr(kernels.toolchain, "problem", broken)
    assert "unknown" in fresh_kernels.status("cuda")


def test_build_failure_is_reported_not_raised(fresh_kernels, monkeypatch):
    monkeypatch.setattr(kernels.toolchain, "problem", lambda device_type, enabled: None)
    monkeypatch.setattr(kernels.toolchain, "prebuilt_module", lambda device_type: None)

    def failing_build(device_type):
        raise RuntimeError("Error building extension\nnorm.cu(12): error: something")

    monkeypatch.setattr(kernels._build_module, "build", failing_build)
    assert fresh_kernels.available("rms_norm_fwd", "cuda") is False
    status = fresh_kernels.status("cuda")
    assert status.startswith("cuda: build failed") and "norm.cu(12)" in status
    # the failure is cached: no second build attempt in this process
    monkeypatch.setattr(kernels._build_module, "build",
                        lambda d: pytest.fail("rebuilt after a failure"))
    assert fresh_kernels.available("swiglu_fwd", "cuda") is False


def test_switch_off_variable(fresh_kernels):
    from megatron_musa_patch.lib.ops import policy
    from megatron_musa_patch.core.settings import from_env

    assert policy.Policy.from_settings(
        from_env({"MEGATRON_MUSA_PATCH_KERNELS": "0"})).kernels is False
    with policy.overridden(kernels=False):
        assert fresh_kernels.available("rms_norm_fwd", "cuda") is False
        assert "switched off by MEGATRON_MUSA_PATCH_KERNELS=0" in fresh_kernels.status("cuda")


def test_build_dir_respects_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    path = kernels._build_module.build_dir("cuda")
    assert path.parent == tmp_path / "mmp"
    assert re.fullmatch(r"mmp_kernels_cuda_[0-9a-f]{10}", path.name)


def test_import_is_light():
    """Importing the loader must not import torch (it is imported by the op modules, and `mmp
    doctor` only asks for a status line); nor must the sources module setup.py loads by path."""
    # the test process's environment as it is (MEGATRON_MUSA_PATCH_AUTOACTIVATE=0 from
    # conftest): the start-up hook must not activate, and import torch, before the probe runs
    out = run_probe("tests.lib.ops.probes.kernels_import_light",
                    REPO / "megatron_musa_patch/lib/ops/kernels/sources.py",
                    env=dict(os.environ), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_setup_skips_the_build_without_a_toolchain():
    """`MMP_BUILD_KERNELS=1 python setup.py --version` on a machine without CUDA torch: skipped
    with a message, and without the variable setup.py never imports torch."""
    env = {k: v for k, v in os.environ.items() if k != "MMP_BUILD_KERNELS"}
    plain = subprocess.run([sys.executable, "-X", "importtime", "setup.py", "--version"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert not re.search(r"\|\s+torch$", plain.stderr, re.M), "setup.py imported torch"
    import torch

    if torch.version.cuda:
        pytest.skip("CUDA torch present: the build would run")
    built = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO,
                           env={**env, "MMP_BUILD_KERNELS": "1"}, capture_output=True, text=True,
                           timeout=120)
    assert built.returncode == 0, built.stderr
    assert "not building csrc/" in built.stdout
