"""Importing an upstream module that imports triton at its top, without triton (from 0.18
`import megatron.core` reaches the MoE paged stash's triton kernels): its Python code runs, its
kernels say they need triton when launched, and triton stays missing for everyone else."""

import sys

import pytest

from tests.conftest import run_python, subprocess_env

BLOCK_TRITON = """
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError("No module named 'triton' (blocked by the test)")
        return None
sys.meta_path.insert(0, NoTriton())
"""

KERNELS = '''
import triton
import triton.language as tl

BLOCK = 1024

@triton.jit
def copy_kernel(src, dst, N: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)

def launch(x):
    copy_kernel[(triton.cdiv(x, BLOCK),)](x, x, N=x, BLOCK_SIZE=BLOCK)
'''


def test_a_module_with_triton_kernels_imports_and_its_kernels_explain(tmp_path):
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernels.py").write_text(KERNELS)
    code = BLOCK_TRITON + f"""
sys.path.insert(0, {str(tmp_path)!r})
import types, importlib
import fakepkg
from megatron_musa_patch.upstream.triton_free import execute_without_triton
from megatron_musa_patch.core.errors import UnsupportedOnDeviceError
module = types.ModuleType("fakepkg.kernels")
sys.modules["fakepkg.kernels"] = module
execute_without_triton(module, "the fake feature (--fake)")
assert module.BLOCK == 1024 and module.__file__.endswith("kernels.py")
try:
    module.launch(4096)
except UnsupportedOnDeviceError as exc:
    print("REFUSED", exc)
try:
    import triton
except ModuleNotFoundError:
    print("TRITON STILL MISSING")
"""
    proc = run_python(code, env=subprocess_env(MEGATRON_MUSA_PATCH_AUTOACTIVATE="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("REFUSED the fake feature (--fake) runs the triton kernel copy_kernel, and triton "
            "is not installed here") in proc.stdout
    assert "TRITON STILL MISSING" in proc.stdout


def test_megatron_core_imports_without_triton(release):
    if release.series < "0.18":
        pytest.skip(f"megatron-core {release.series} imports no triton kernel at its top "
                    f"(the paged stash's arrive in 0.18)")
    kernels = ("megatron.core.transformer.moe.paged_stash" if release.series == "0.18" else
               "megatron.core.transformer.moe.ops.paged_stash")
    code = BLOCK_TRITON + f"""
import megatron_musa_patch
import megatron.core
from megatron.core.models.gpt import gpt_model
from {kernels} import GLOBAL_BLOCK_SIZE
print("IMPORTED", GLOBAL_BLOCK_SIZE)
print("STATUS", [r.status for r in megatron_musa_patch.report()
                 if r.id == "cuda_free_startup.paged_stash_without_triton"])
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED 1024" in proc.stdout and "'applied'" in proc.stdout
    # and without the layer, upstream's own import fails: the patch is what makes it work
    upstream = run_python(BLOCK_TRITON + "import megatron.core")
    assert upstream.returncode != 0 and "triton" in upstream.stderr
