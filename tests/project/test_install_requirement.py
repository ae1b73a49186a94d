"""Installing the layer never changes the user's Megatron or torch: the megatron-core requirement
admits every supported release and the torch requirement has no version, so pip keeps what is
installed (on a MUSA machine the MUSA SDK's torch, whatever it calls itself).

Checked two ways: pip's own resolver in a dry run against this environment (any release), and in
CI's environments, where torch and megatron-core were installed before the package, that they are
still the ones installed (MMP_EXPECT_MEGATRON_CORE, MMP_EXPECT_TORCH). The dry run uses the
project's own constraints (scripts/constraints.txt), not a machine-wide pip configuration."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from packaging.requirements import Requirement

from tests.conftest import REPO


def test_pip_keeps_the_installed_megatron_core_and_torch(tmp_path):
    installed = importlib.metadata.version("megatron-core")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation",
         "--quiet", "--report", str(report), str(REPO)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PIP_CONSTRAINT": str(REPO / "scripts" / "constraints.txt")})
    if proc.returncode != 0 and "No matching distribution" in proc.stderr:
        pytest.skip(f"pip cannot reach a package index here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "megatron-core" not in planned, (installed, planned.get("megatron-core"))
    assert "torch" not in planned, (importlib.metadata.version("torch"), planned.get("torch"))
    assert "megatron-musa-patch" in planned


def test_the_torch_requirement_admits_every_torch():
    """No version at all: a vendor's build ("2.11.0a0+git..."), a torch newer than the table
    and an older one all satisfy it, so pip never replaces one (the activation checks the
    table instead, with the fix)."""
    from megatron_musa_patch.upstream import tables

    requirement = Requirement(tables.TORCH_REQUIREMENT)
    assert requirement.name == "torch" and str(requirement.specifier) == ""
    for version in ("2.11.0a0+git1a2b3c", "2.16.0", "2.7.1"):
        assert requirement.specifier.contains(version, prereleases=True)


@pytest.mark.parametrize("distribution,variable", [("megatron-core", "MMP_EXPECT_MEGATRON_CORE"),
                                                   ("torch", "MMP_EXPECT_TORCH")])
def test_the_release_installed_before_the_package_is_still_installed(distribution, variable):
    expected = os.environ.get(variable)
    if not expected:
        pytest.skip(f"{variable} is unset (CI sets it for its environments, where "
                    f"{distribution} is installed before the package)")
    assert importlib.metadata.version(distribution) == expected
