"""The support tables (upstream/tables.py), the one range syntax and comparator
(upstream/ranges.py), and the one-paragraph mismatches of upstream/check.py: a megatron-core or
torch outside the tables, a Python older than the release needs, a checkout of one release
beside a megatron-core of another, a checkout shadowing the wheel's megatron.training, a
torch_musa built on another torch than the installed one or beside a CUDA build."""

from pathlib import Path

import pytest
from packaging.version import Version

from megatron_musa_patch.upstream import check as release_check
from megatron_musa_patch.upstream import installed as versions
from megatron_musa_patch.upstream import ranges, tables
from megatron_musa_patch.upstream.check import ReleaseMismatchError
from megatron_musa_patch.upstream.ranges import Range, row_of

REPO = Path(__file__).resolve().parents[2]


def checkout(tmp_path, version: str) -> Path:
    """A directory that reads as a Megatron-LM checkout of ``version``."""
    root = tmp_path / f"Megatron-LM-{version}"
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "training" / "__init__.py").write_text("")
    major, minor, patch = version.split(".")
    (root / "megatron" / "core" / "package_info.py").write_text(
        f"MAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = ''\n")
    return root


@pytest.fixture
def installed(monkeypatch):
    def set_versions(core, python=(3, 12, 1)):
        monkeypatch.setattr(versions, "megatron_core_version", lambda: Version(core))
        monkeypatch.setattr(release_check, "python_version", lambda: python)
    return set_versions


def test_the_megatron_table_covers_0_16_through_0_19_and_the_requirement_admits_all():
    assert [r.series for r in tables.MEGATRON] == ["0.16", "0.17", "0.18", "0.19"]
    assert tables.MEGATRON_SUPPORTED == ">=0.16.1,<0.20"
    assert tables.MEGATRON_REQUIREMENT == "megatron-core>=0.16.1,<0.20"
    assert row_of(tables.MEGATRON, "0.19.2").lm_tag == "core_v0.19.0"
    assert row_of(tables.MEGATRON, "0.16.0") is None and row_of(tables.MEGATRON, "0.20.0") is None
    assert row_of(tables.MEGATRON, "0.16.1").training_from == "checkout"
    assert row_of(tables.MEGATRON, "0.17.1").training_from == "wheel"
    assert ranges.newer_than(tables.MEGATRON, "0.20.1")
    assert not ranges.newer_than(tables.MEGATRON, "0.19.9")


def test_the_torch_table_runs_from_torch_musas_torch_to_the_newest():
    """Oldest: the torch the newest torch_musa is built on; newest: the registry's newest."""
    assert [r.series for r in tables.TORCH] == ["2.11", "2.12", "2.13", "2.14", "2.15"]
    assert tables.TORCH[0].torch_musa == "2.11.0.post2"
    assert tables.TORCH_SUPPORTED == ">=2.11.0,<2.16" and tables.TORCH_EXTRA == "torch>=2.11.0,<2.16"
    # installing the layer never moves torch: no version in the requirement
    assert tables.TORCH_REQUIREMENT == "torch"
    for version, series in (("2.11.0", "2.11"), ("2.14.1", "2.14"), ("2.15.0", "2.15"),
                            ("2.13.0+cpu", "2.13"), ("2.11.0a0+git1a2b3c", "2.11")):
        assert row_of(tables.TORCH, version).series == series
    assert row_of(tables.TORCH, "2.10.0") is None and row_of(tables.TORCH, "2.16.0") is None


def test_one_range_syntax_and_one_comparator():
    assert "2.11.0a0+git1a2b3c" in Range.parse(">=2.11,<2.16")   # a source build of 2.11.0
    assert "2.11.0.post2+musa5.2" in Range.parse(">=2.11,<2.12")  # torch_musa's spelling
    assert "0.20.0rc1" not in Range.parse(">=0.16.1,<0.20")       # a candidate of 0.20
    assert "0.16.0" not in Range.parse(">=0.16.1,<0.20") and "0.16.1" in Range.parse(">=0.16.1")
    assert Range.parse(">=0.18").intersection(Range.parse(">=0.16.1,<0.20")).spec == ">=0.18,<0.20"
    assert not Range.parse(">=0.16.1,<0.17").overlaps(Range.parse(">=0.17,<0.20"))
    assert Range.parse("==2.13.0").overlaps(Range.parse(">=2.13,<2.14"))
    assert not Range.parse(">=0.18").bounded and Range.parse(">=0.18,<0.20").bounded
    with pytest.raises(ValueError, match="only >=, >, <, <= and == are used"):
        Range.parse("~=0.18")
    with pytest.raises(ValueError, match="not a PEP 440 specifier"):
        Range.parse("0.18+")


def test_setup_constraints_and_readme_derive_from_the_tables():
    setup = (REPO / "setup.py").read_text()
    assert "TABLES.MEGATRON_REQUIREMENT" in setup and "TABLES.TORCH_REQUIREMENT" in setup
    assert "TABLES.TORCH_EXTRA" in setup and "torch>=" not in setup
    assert tables.markdown_tables() in (REPO / "README.md").read_text()
    assert tables.markdown_tables() in (REPO / "docs" / "installation.md").read_text()
    constraints = (REPO / "scripts" / "constraints.txt").read_text().split()
    assert f"torch{tables.TORCH_SUPPORTED}" in constraints
    assert tables.MEGATRON_REQUIREMENT in constraints


def test_supported_combinations_pass(installed, tmp_path):
    installed("0.19.2")
    assert release_check.check(checkout(tmp_path, "0.19.1"), False) is None
    assert release_check.check(None, False) is None
    installed("0.16.1", python=(3, 11, 7))
    assert release_check.check(checkout(tmp_path, "0.16.1"), False) is None


def test_a_megatron_core_newer_than_the_table_is_refused_unless_allowed(installed):
    installed("0.20.0")
    with pytest.raises(ReleaseMismatchError) as caught:
        release_check.check(None, False)
    text = str(caught.value)
    assert "megatron-core 0.20.0 is installed, but this layer supports >=0.16.1,<0.20" in text
    assert "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1" in text and "--resolve-all --strict" in text
    warning = release_check.check(None, True)
    assert "0.20.0 is not in the support table" in warning and "unverified" in warning


def test_python_older_than_the_release_needs(installed, tmp_path):
    installed("0.19.2", python=(3, 11, 7))
    with pytest.raises(ReleaseMismatchError, match=r"megatron-core 0\.19\.2 needs Python >= 3\.12, "
                                                   r"and this is Python 3\.11\.7"):
        release_check.check(None, False)
    # pip on 3.11 gives 0.16.1: a 0.19 checkout beside it needs another Python and core
    installed("0.16.1", python=(3, 11, 7))
    with pytest.raises(ReleaseMismatchError) as caught:
        release_check.check(checkout(tmp_path, "0.19.1"), False)
    text = str(caught.value)
    assert "is 0.19.1 (core_v0.19.0), which needs Python >= 3.12" in text
    assert "Check out core_v0.16.1 there" in text


def test_a_checkout_of_another_release_than_megatron_core(installed, tmp_path):
    installed("0.19.2")
    with pytest.raises(ReleaseMismatchError) as caught:
        release_check.check(checkout(tmp_path, "0.16.1"), False)
    text = str(caught.value)
    assert "is 0.16.1 (core_v0.16.1) but megatron-core 0.19.2 is installed" in text
    assert "checkout core_v0.19.0" in text and "megatron-core>=0.16.1,<0.17" in text


def test_a_checkout_outside_the_table(installed, tmp_path):
    installed("0.19.2")
    with pytest.raises(ReleaseMismatchError, match="is Megatron-LM 0.15.0, but this layer supports"):
        release_check.check(checkout(tmp_path, "0.15.0"), False)


def test_a_checkout_shadowing_the_wheels_training(installed, tmp_path, monkeypatch):
    installed("0.19.2")
    root = checkout(tmp_path, "0.19.1")
    (root / "megatron" / "core" / "__init__.py").write_text("")
    wheel = tmp_path / "site-packages"
    for package in ("core", "training"):
        (wheel / "megatron" / package).mkdir(parents=True)
        (wheel / "megatron" / package / "__init__.py").write_text("")
    import sys

    monkeypatch.setattr(release_check, "_wheel_root", lambda: wheel.resolve())
    monkeypatch.delitem(sys.modules, "megatron.training", raising=False)
    monkeypatch.setattr(sys, "path", [str(root), str(wheel)])
    with pytest.raises(ReleaseMismatchError, match="megatron.training would be imported from .* "
                                                   "instead of megatron-core 0.19.2's own"):
        release_check.check_training_source(root)
    monkeypatch.setattr(sys, "path", [str(wheel), str(root)])
    release_check.check_training_source(root)  # the layer's order: the wheel first
    monkeypatch.setattr(sys, "path", [str(root), str(wheel)])
    installed("0.16.1")
    release_check.check_training_source(root)  # 0.16 ships no training: the checkout's is right


# ----------------------------------------------------------------------------- torch


def test_a_torch_outside_the_table_is_refused_unless_allowed():
    for version, where in (("2.16.0", "newer than"), ("2.10.0", "older than")):
        with pytest.raises(ReleaseMismatchError) as caught:
            release_check.check_torch(False, version=Version(version))
        text = str(caught.value)
        assert text.startswith(f"torch {version} is installed, {where} the torch releases this "
                               f"layer supports: >=2.11.0,<2.16 (2.11 to 2.15; 2.11 is the torch "
                               f"torch_musa 2.11.0.post2 is built on)")
        assert "pip install 'torch>=2.11.0,<2.16'" in text
        assert "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1" in text
        warning = release_check.check_torch(True, version=Version(version))
        assert warning.startswith(f"torch {version} is not in the support table")
    for version in ("2.11.0", "2.13.0+cpu", "2.15.0", "2.11.0a0+git1a2b3c"):
        assert release_check.check_torch(False, version=Version(version)) is None


def test_a_torch_musa_built_on_another_torch():
    text = release_check.torch_musa_mismatch("2.13.0", None, torch_musa="2.11.0.post2")
    assert text.startswith("torch_musa 2.11.0.post2 is built on torch 2.11.0, but torch 2.13.0 "
                           "is installed: torch_musa cannot load beside it")
    assert "Reinstall the torch that came with your MUSA SDK (torch 2.11.0" in text
    assert "PIP_CONSTRAINT" in text and "MEGATRON_MUSA_PATCH_DEVICE=cpu" in text
    assert release_check.torch_musa_mismatch("2.11.0a0+gitabc", None,
                                             torch_musa="2.11.0.post2+musa5.2") is None


def test_a_cuda_build_of_torch_beside_torch_musa():
    """What pip leaves on a MUSA machine when a package asks for another torch: PyPI's CUDA
    build, even of the same version, in place of the MUSA SDK's."""
    text = release_check.torch_musa_mismatch("2.11.0", "13.0", torch_musa="2.11.0.post2")
    assert text.startswith("torch 2.11.0 is a CUDA build (CUDA 13.0), but torch_musa "
                           "2.11.0.post2 is installed, which is built on the MUSA SDK's torch "
                           "2.11.0: pip has replaced the MUSA torch")
    assert release_check.torch_musa_mismatch("2.11.0", "13.0", torch_musa=None) is None
