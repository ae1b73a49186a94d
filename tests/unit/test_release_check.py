"""The support table (releases.py) and the one-paragraph mismatches of release_check: a
megatron-core outside the table, a Python older than the release needs, a checkout of one
release beside a megatron-core of another, a checkout shadowing the wheel's megatron.training."""

from pathlib import Path

import pytest
from packaging.version import Version

from megatron_musa_patch import release_check, releases, versions
from megatron_musa_patch.release_check import ReleaseMismatchError

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


def test_the_table_covers_0_16_through_0_19_and_the_requirement_admits_all():
    assert [r.series for r in releases.RELEASES] == ["0.16", "0.17", "0.18", "0.19"]
    assert releases.VERIFIED_MEGATRON == ">=0.16.1,<0.20"
    assert releases.INSTALL_REQUIREMENT == "megatron-core>=0.16.1,<0.20"
    assert releases.release_of("0.19.2").lm_tag == "core_v0.19.0"
    assert releases.release_of("0.16.0") is None and releases.release_of("0.20.0") is None
    assert releases.release_of("0.16.1").training_from == "checkout"
    assert releases.release_of("0.17.1").training_from == "wheel"
    assert releases.newer_than_table("0.20.1") and not releases.newer_than_table("0.19.9")


def test_setup_and_readme_derive_from_the_table():
    setup = (REPO / "setup.py").read_text()
    assert "RELEASES.INSTALL_REQUIREMENT" in setup and "<0.17" not in setup
    assert releases.markdown_table() in (REPO / "README.md").read_text()


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
    assert "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1" in text and "--resolve-all" in text
    warning = release_check.check(None, True)
    assert "0.20.0 is not in the support table" in warning and "--resolve-all" in warning


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
