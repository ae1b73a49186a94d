"""Installing the layer never changes the user's Megatron: the requirement admits every
supported release, so pip keeps the megatron-core that is installed.

Checked two ways: pip's own resolver in a dry run against this environment (any release), and in
CI's Python 3.12 environment, where megatron-core 0.19.2 was installed before the package, that
it is still the one installed (MMP_EXPECT_MEGATRON_CORE)."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from ..conftest import REPO


def test_pip_keeps_the_installed_megatron_core(tmp_path):
    installed = importlib.metadata.version("megatron-core")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation",
         "--quiet", "--report", str(report), str(REPO)],
        capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "No matching distribution" in proc.stderr:
        pytest.skip(f"pip cannot reach a package index here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "megatron-core" not in planned, (installed, planned.get("megatron-core"))
    assert "megatron-musa-patch" in planned


def test_the_release_installed_before_the_package_is_still_installed():
    expected = os.environ.get("MMP_EXPECT_MEGATRON_CORE")
    if not expected:
        pytest.skip("MMP_EXPECT_MEGATRON_CORE is unset (CI sets it for its Python 3.12 "
                    "environment, where megatron-core 0.19.2 is installed before the package)")
    assert importlib.metadata.version("megatron-core") == expected
