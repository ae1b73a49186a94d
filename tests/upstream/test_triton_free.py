"""Importing an upstream module that imports triton at its top, without triton (from 0.18
`import megatron.core` reaches the MoE paged stash's triton kernels): its Python code runs, its
kernels say they need triton when launched, and triton stays missing for everyone else."""

import shutil

import pytest

from tests.conftest import FIXTURES, run_probe, subprocess_env


def test_a_module_with_triton_kernels_imports_and_its_kernels_explain(tmp_path):
    # the fake package, written where the probe puts it on sys.path
    shutil.copytree(FIXTURES / "triton_free" / "fakepkg", tmp_path / "fakepkg",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = run_probe("tests.upstream.probes.triton_free_fake_kernels", tmp_path,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_AUTOACTIVATE="0"))
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
    proc = run_probe("tests.upstream.probes.triton_free_core", kernels)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED 1024" in proc.stdout and "'applied'" in proc.stdout
    # and without the layer, upstream's own import fails: the patch is what makes it work
    upstream = run_probe("tests.upstream.probes.triton_free_upstream")
    assert upstream.returncode != 0 and "triton" in upstream.stderr
