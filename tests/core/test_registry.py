"""Registry semantics: kinds, post-import application, gating, failures, undo."""

import importlib
import shutil
import sys
import types
import uuid

import pytest

from packaging.version import Version

from megatron_musa_patch.base.errors import PatchError, PluginError
from megatron_musa_patch.core.records import VERIFIED, Patch
from megatron_musa_patch.core.registry import Registry
from megatron_musa_patch.upstream import installed as versions
from megatron_musa_patch.upstream import tables

from tests.conftest import FIXTURES

#: test records apply on every supported release
ANY = tables.MEGATRON_SUPPORTED


@pytest.fixture
def fake_module(tmp_path, monkeypatch):
    """A fresh, not yet imported module with a unique name; returns (name, importer)."""
    name = f"mmp_fake_{uuid.uuid4().hex[:8]}"
    shutil.copy(FIXTURES / "registry_target.py", tmp_path / f"{name}.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, tmp_path
    sys.modules.pop(name, None)


def wrapper_upper(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs).upper()


def test_wrap_applies_when_the_module_is_imported_later(fake_module):
    name, path = fake_module
    reg = Registry("cpu")
    reg.add(Patch("t.greet", f"{name}:greet", "wrap", wrapper_upper, "test", megatron=ANY))
    reg.activate()
    assert reg.result("t.greet").status == "deferred"
    mod = importlib.import_module(name)
    assert reg.result("t.greet").status == "applied"
    assert mod.greet() == "HELLO WORLD"
    # a module imported afterwards that copies the name sees the patched function
    user = f"{name}_user"
    (path / f"{user}.py").write_text(f"from {name} import greet\n")
    assert importlib.import_module(user).greet("x") == "HELLO X"
    sys.modules.pop(user, None)
    reg.unpatch()
    assert mod.greet() == "hello world"


def test_replace_attribute_and_methods(fake_module):
    name, _ = fake_module
    mod = importlib.import_module(name)
    reg = Registry("cpu")
    reg.add(Patch("t.replace", f"{name}:greet", "replace", lambda name="x": "replaced", "test",
                  megatron=ANY))
    reg.add(Patch("t.attr", f"{name}:VALUE", "attribute", 42, "test", megatron=ANY))
    reg.add(Patch("t.new", f"{name}:NEW", "attribute", "n", "test", create=True, megatron=ANY))
    reg.add(Patch("t.method", f"{name}:Box.label", "wrap", wrapper_upper, "test", megatron=ANY))
    reg.add(Patch("t.static", f"{name}:Box.kind", "wrap", wrapper_upper, "test", megatron=ANY))
    reg.add(Patch("t.inherited", f"{name}:Box.size", "replace", lambda self: 7, "test",
                  megatron=ANY))
    reg.activate()
    assert (mod.greet(), mod.VALUE, mod.NEW) == ("replaced", 42, "n")
    assert mod.Box().label() == "BOX"
    assert mod.Box.kind() == "STATIC" and mod.Box().kind() == "STATIC"
    assert mod.Box().size() == 7 and mod.Base().size() == 1
    reg.unpatch()
    assert (mod.greet(), mod.VALUE, hasattr(mod, "NEW")) == ("hello world", 1, False)
    assert mod.Box().label() == "box" and mod.Box.kind() == "static"
    assert "size" not in vars(mod.Box) and mod.Box().size() == 1


def test_activation_is_idempotent(fake_module):
    name, _ = fake_module
    calls = []

    def counting(wrapped, instance, args, kwargs):
        calls.append(1)
        return wrapped(*args, **kwargs)

    mod = importlib.import_module(name)
    reg = Registry("cpu")
    reg.add(Patch("t.count", f"{name}:greet", "wrap", counting, "test", megatron=ANY))
    reg.activate()
    reg.activate()
    reg._on_import(mod)  # a second import notification must not wrap twice
    mod.greet()
    assert calls == [1]
    reg.unpatch()


def test_device_condition_and_disabled_feature_skip_with_reasons(fake_module):
    name, _ = fake_module
    mod = importlib.import_module(name)
    from megatron_musa_patch.core.toggles import decide

    reg = Registry("cpu", decide({"off": False, "test": False}, ["off"], None))
    reg.add(Patch("t.musa_only", f"{name}:VALUE", "attribute", 2, "test",
                  devices=frozenset({"musa"}), megatron=ANY))
    reg.add(Patch("t.cond", f"{name}:greet", "replace", len, "test",
                  condition=lambda: "not wanted here", megatron=ANY))
    reg.add(Patch("t.disabled", f"{name}:Box", "attribute", None, "off", megatron=ANY))
    reg.activate()
    assert mod.VALUE == 1 and mod.greet() == "hello world" and mod.Box is not None
    reasons = {r.id: (r.status, r.reason) for r in reg.results()}
    assert reasons["t.musa_only"] == ("skipped", "not needed on cpu (applies on musa)")
    assert reasons["t.cond"] == ("skipped", "not wanted here")
    assert reasons["t.disabled"] == (
        "skipped", "feature 'off' switched off by MEGATRON_MUSA_PATCH_DISABLE=off")


def _megatron_fake(monkeypatch):
    """A module inside megatron.core's namespace, so patches on it are version-gated."""
    pytest.importorskip("megatron.core")
    name = f"megatron.core._mmp_fake_{uuid.uuid4().hex[:8]}"
    mod = types.ModuleType(name)
    mod.present = lambda: "present"
    monkeypatch.setitem(sys.modules, name, mod)
    return name, mod


def test_a_record_for_a_later_release_is_skipped_naming_its_range(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)
    installed = str(versions.megatron_core_version())
    reg = Registry("cpu", allow_unverified=False)
    reg.add(Patch("t.later", f"{name}:present", "replace", lambda: "new", "feat",
                  megatron=">=0.99,<0.100", starts="upstream has it from 0.99"))
    reg.add(Patch("t.ok", f"{name}:present", "wrap", wrapper_upper, "feat", megatron=ANY))
    reg.activate()
    later = reg.result("t.later")
    assert later.status == "skipped"
    assert later.reason == (f"for megatron-core >=0.99,<0.100, not {installed}: upstream has it "
                            f"from 0.99")
    assert reg.result("t.ok").status == "applied" and mod.present() == "PRESENT"
    assert reg.feature_problems("feat") == []
    reg.unpatch()


def test_a_release_outside_the_table_fails_unless_allowed(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)
    reg = Registry("cpu", allow_unverified=False, version_of=lambda module: Version("0.15.0"))
    reg.add(Patch("t.any", f"{name}:present", "wrap", wrapper_upper, "feat", megatron=ANY))
    reg.activate()
    failed = reg.result("t.any")
    assert failed.status == "failed" and "feat" in failed.reason and "0.15.0" in failed.reason
    assert "ALLOW_UNVERIFIED=1" in failed.reason and reg.feature_problems("feat") == [failed.reason]
    reg.unpatch()

    strict = Registry("cpu", version_of=lambda module: Version("0.99.0"))
    strict.add(Patch("t.strict", f"{name}:present", "replace", len, "feat", strict=True,
                     megatron=ANY))
    with pytest.raises(PatchError, match="was verified on megatron-core >=0.16.1,<0.20 "):
        strict.activate()

    # allowed: a newer release is tried as the newest of the table, and reported unverified
    tried = Registry("cpu", allow_unverified=True, version_of=lambda module: Version("0.20.1"))
    tried.add(Patch("t.new", f"{name}:present", "wrap", wrapper_upper, "feat", megatron=ANY))
    tried.add(Patch("t.old", f"{name}:present", "replace", len, "feat",
                    megatron=">=0.16.1,<0.17", ends="upstream fixed it in 0.17"))
    tried.activate()
    new = tried.result("t.new")
    assert new.status == "unverified" and mod.present() == "PRESENT"
    assert "0.20.1 is outside the support table: tried as 0.19.0" in new.reason
    assert tried.result("t.old").status == "skipped"
    assert tried.result("t.old").reason.endswith("upstream fixed it in 0.17")
    assert tried.feature_problems("feat") == [] and tried.why_unavailable("feat") is None
    tried.unpatch()


def test_a_release_added_to_the_table_leaves_every_record_not_verified_on_it_unverified(
        monkeypatch):
    """A 0.20 row (simulated): records verified up to <0.20 are tried and reported unverified,
    unless upstream made them unnecessary (ends) or a newer variant takes over."""
    name, mod = _megatron_fake(monkeypatch)
    monkeypatch.setattr(tables, "MEGATRON", tables.MEGATRON + (
        tables.MegatronRelease("0.20", "core_v0.20.0", "0.20.0", "3.12", "wheel"),))
    reg = Registry("cpu", version_of=lambda module: Version("0.20.1"))
    reg.add(Patch("t.open", f"{name}:present", "wrap", wrapper_upper, "feat", megatron=ANY))
    reg.add(Patch("t.fixed", f"{name}:present", "replace", len, "feat",
                  megatron=">=0.16.1,<0.17", ends="not needed: upstream fixed it in 0.17"))
    reg.add(Patch("t.moved", f"{name}:present", "replace", len, "feat",
                  megatron=">=0.16.1,<0.18"))
    reg.add(Patch("t.moved", f"{name}:other", "replace", len, "feat", megatron=">=0.18,<0.20",
                  create=True))
    reg.activate()
    rows = {(r.id, r.variant): (r.status, r.reason) for r in reg.results()}
    status, reason = rows[("t.open", "")]
    assert status == "unverified" and mod.present() == "PRESENT"
    assert reason == ("verified on megatron-core >=0.16.1,<0.20, not on the installed 0.20.1: "
                      "re-verify it and move the bound (docs/compatibility.md)")
    assert rows[("t.fixed", "")] == ("skipped", "for megatron-core >=0.16.1,<0.17, not 0.20.1: "
                                                "not needed: upstream fixed it in 0.17")
    assert rows[("t.moved", ">=0.16.1,<0.18")][0] == "skipped"
    assert rows[("t.moved", ">=0.18,<0.20")][0] == "unverified"
    assert reg.result("t.moved").variant == ">=0.18,<0.20"
    reg.unpatch()


def test_torch_ranges_gate_like_megatron_ranges(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)

    def registry(torch, allow=False):
        reg = Registry("cpu", allow_unverified=allow, torch_version=Version(torch))
        reg.add(Patch("t.torch", f"{name}:present", "wrap", wrapper_upper, "feat",
                      megatron=ANY, torch=">=2.11,<2.16"))
        reg.add(Patch("t.newer_torch", f"{name}:later", "attribute", 1, "feat", create=True,
                      megatron=ANY, torch=">=2.14,<2.16", starts="torch has it from 2.14"))
        reg.activate()
        return reg

    reg = registry("2.13.0+cpu")
    assert reg.result("t.torch").status == "applied" and mod.present() == "PRESENT"
    assert reg.result("t.newer_torch").reason == ("for torch >=2.14,<2.16, not 2.13.0+cpu: "
                                                  "torch has it from 2.14")
    reg.unpatch()
    # a vendor's source build counts as the release it was built from
    reg = registry("2.11.0a0+git1a2b3c")
    assert reg.result("t.torch").status == "applied"
    reg.unpatch()
    reg = registry("2.16.0")
    assert reg.result("t.torch").status == "failed"
    assert "verified on torch >=2.11,<2.16 but 2.16.0 is installed" in reg.result("t.torch").reason
    reg.unpatch()
    reg = registry("2.16.0", allow=True)
    assert reg.result("t.torch").status == "unverified" and mod.present() == "PRESENT"
    reg.unpatch()
    monkeypatch.setattr(tables, "TORCH", tables.TORCH + (tables.TorchRelease("2.16", "2.16.0"),))
    reg = registry("2.16.0")
    assert reg.result("t.torch").status == "unverified"
    assert reg.result("t.torch").reason.startswith("verified on torch >=2.11,<2.16, not on the "
                                                   "installed 2.16.0")
    reg.unpatch()


def test_variants_of_one_patch_apply_by_release_and_may_not_overlap(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)
    reg = Registry("cpu", version_of=lambda module: Version("0.18.2"))
    reg.add(Patch("t.moved", f"{name}:present", "replace", lambda: "old", "feat",
                  megatron=">=0.16.1,<0.18"))
    reg.add(Patch("t.moved", f"{name}:present", "replace", lambda: "new", "feat",
                  megatron=">=0.18,<0.20"))
    with pytest.raises(ValueError, match="overlapping ranges"):
        reg.add(Patch("t.moved", f"{name}:present", "replace", len, "feat",
                      megatron=">=0.17,<0.20"))
    # variants may differ by torch range alone
    reg.add(Patch("t.torch_variant", f"{name}:a", "attribute", 1, "feat", create=True,
                  megatron=ANY, torch=">=2.11,<2.14"))
    reg.add(Patch("t.torch_variant", f"{name}:a", "attribute", 2, "feat", create=True,
                  megatron=ANY, torch=">=2.14,<2.16"))
    with pytest.raises(ValueError, match="overlapping ranges"):
        reg.add(Patch("t.torch_variant", f"{name}:a", "attribute", 3, "feat", create=True,
                      megatron=ANY, torch=">=2.13,<2.15"))
    reg.activate()
    assert mod.present() == "new"
    rows = [r for r in reg.results() if r.id == "t.moved"]
    assert [(r.variant, r.status) for r in rows] == [(">=0.16.1,<0.18", "skipped"),
                                                     (">=0.18,<0.20", "applied")]
    assert rows[0].reason == ("for megatron-core >=0.16.1,<0.18, not 0.18.2 (a newer variant "
                              "applies)")
    assert reg.result("t.moved").variant == ">=0.18,<0.20"
    assert {r.variant for r in reg.results() if r.id == "t.torch_variant"} == {
        "torch>=2.11,<2.14", "torch>=2.14,<2.16"}
    reg.unpatch()
    assert mod.present() == "present"


def test_missing_target_names_target_feature_and_version(monkeypatch):
    name, _ = _megatron_fake(monkeypatch)
    installed = str(versions.megatron_core_version())
    reg = Registry("cpu")
    reg.add(Patch("t.gone", f"{name}:renamed_upstream", "wrap", wrapper_upper, "myfeature", megatron=ANY))
    reg.activate()
    result = reg.result("t.gone")
    assert result.status == "failed"
    for part in (f"{name}:renamed_upstream", "myfeature", installed,
                 "MEGATRON_MUSA_PATCH_DISABLE=myfeature"):
        assert part in result.reason

    strict = Registry("cpu")
    strict.add(Patch("t.gone", f"{name}:renamed_upstream", "wrap", wrapper_upper, "device",
                     strict=True, megatron=ANY))
    with pytest.raises(PatchError, match="does not exist in the installed Megatron"):
        strict.activate()


def test_known_copies_are_rebound_and_restored(fake_module):
    name, path = fake_module
    user = f"{name}_copy"
    (path / f"{user}.py").write_text(f"from {name} import greet as hello\n")
    mod = importlib.import_module(name)
    copy = importlib.import_module(user)  # imported before the patch: a stale copy
    reg = Registry("cpu")
    reg.add(Patch("t.rebind", f"{name}:greet", "wrap", wrapper_upper, "test", rebind=(user,), megatron=ANY))
    reg.activate()
    assert copy.hello() == "HELLO WORLD" and mod.greet() == "HELLO WORLD"
    reg.unpatch()
    assert copy.hello() == "hello world"
    sys.modules.pop(user, None)


def test_late_activation_scans_megatron_modules_for_copies(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)
    holder = types.ModuleType("megatron.core._mmp_holder")
    holder.present = mod.present
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    reg = Registry("cpu")
    reg.scan_for_copies = True
    reg.add(Patch("t.scan", f"{name}:present", "wrap", wrapper_upper, "test", megatron=ANY))
    reg.activate()
    assert holder.present() == "PRESENT"
    reg.unpatch()
    assert holder.present() == "present"


def test_module_stand_in_is_served_only_while_needed():
    name = f"mmp_missing_{uuid.uuid4().hex[:8]}"

    def fill(module):
        module.answer = 42

    reg = Registry("cpu")
    reg.add(Patch("t.stand_in", f"{name}:*", "module", fill, "test", megatron=ANY))
    reg.activate()
    assert importlib.import_module(name).answer == 42
    reg.unpatch()
    assert name not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module(name)


def test_bad_records_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        Patch("x", "a:b", "monkey", None, "f", megatron=ANY)
    with pytest.raises(ValueError, match="module:Qual.name"):
        Patch("x", "a.b", "wrap", None, "f", megatron=ANY)
    with pytest.raises(ValueError, match="bad megatron range"):
        Patch("x", "megatron.core.x:y", "wrap", None, "f", megatron="not a spec")


def test_every_record_declares_bounded_ranges():
    """No implicit default for a plugin's record: one without its megatron-core range, with an
    open or an empty one, or a torch record without its torch range is refused when it is made,
    naming what to write."""
    for empty in ("", None):
        with pytest.raises(ValueError, match=r"names no megatron range: records declare the "
                                             r"releases they were verified on, e\.g\. "
                                             r"megatron='>=0\.16\.1,<0\.20'"):
            Patch("x", "megatron.core.x:y", "wrap", None, "f", megatron=empty)
    for open_ in (">=0.18", VERIFIED):
        with pytest.raises(ValueError, match="needs both bounds|bad megatron range"):
            Patch("x", "megatron.core.x:y", "wrap", None, "f", megatron=open_)
    with pytest.raises(ValueError, match="holds no release"):
        Patch("x", "megatron.core.x:y", "wrap", None, "f", megatron=">=0.21,<0.20")
    with pytest.raises(ValueError, match=r"patches torch \(torch:zeros\) but names no torch "
                                         r"range: give the releases it was verified on, e\.g\. "
                                         r"torch='>=2\.11,<2\.16'"):
        Patch("x", "torch:zeros", "replace", None, "f", megatron=ANY)
    with pytest.raises(ValueError, match="needs both bounds"):
        Patch("x", "torch:zeros", "replace", None, "f", megatron=ANY, torch="<2.16")
    Patch("x", "torch:zeros", "replace", None, "f", megatron=ANY, torch=">=2.11,<2.16")
    # a plugin's record without ranges stops activation with the paragraph, not a traceback
    with pytest.raises(PluginError, match="names no megatron range"):
        Patch("x", "megatron.core.x:y", "wrap", None, "f")
    reg = Registry("cpu")
    reg.add(Patch("x", "a:b", "wrap", None, "f", megatron=ANY))
    with pytest.raises(ValueError, match="twice"):
        reg.add(Patch("x", "a:c", "wrap", None, "f", megatron=ANY))


def test_a_built_in_features_records_take_the_layers_verified_range():
    """``Feature.patch`` names the record after its feature; a built-in feature's record takes
    what its ranges leave open from the layer's verified ones (upstream/tables.py): nothing
    said, the whole range; a lower bound alone, from there on; an upper bound below the layer's,
    verified on less. An external plugin's ``Feature`` names its ranges."""
    from megatron_musa_patch.core.feature import Feature, feature

    assert tables.MEGATRON_VERIFIED == ">=0.16.1,<0.20" and tables.TORCH_VERIFIED == ">=2.11,<2.16"
    built_in = feature("megatron_musa_patch.features.group.part", "a test feature")
    record = built_in.patch("one", "megatron.core.x:y", "wrap", None)
    assert (record.id, record.feature, record.megatron, record.torch) == (
        "group.part.one", "group.part", tables.MEGATRON_VERIFIED, None)
    assert built_in.patch("", "megatron.core.x:y", "wrap", None).id == "group.part"
    ranges = {spec: built_in.patch("r", "megatron.core.x:y", "wrap", None, megatron=spec).megatron
              for spec in (">=0.18", "<0.19", ">=0.18,<0.19", VERIFIED)}
    assert ranges == {">=0.18": ">=0.18,<0.20", "<0.19": ">=0.16.1,<0.19",
                      ">=0.18,<0.19": ">=0.18,<0.19", VERIFIED: ">=0.16.1,<0.20"}
    assert built_in.patch("t", "torch:zeros", "replace", None, torch=VERIFIED).torch == \
        ">=2.11,<2.16"
    with pytest.raises(ValueError, match="holds no release"):
        built_in.patch("late", "megatron.core.x:y", "wrap", None, megatron=">=0.21")
    with pytest.raises(PluginError, match="names no megatron range"):
        Feature("external", "a plugin's").patch("x", "megatron.core.x:y", "wrap", None)
    with pytest.raises(PluginError, match="needs both bounds"):
        Feature("external", "a plugin's").patch("x", "megatron.core.x:y", "wrap", None,
                                                megatron=">=0.18")


def test_a_record_kind_is_typed_and_prints_as_its_word():
    from megatron_musa_patch.core.records import Kind, RecordError

    record = Patch("x.kind", "json:dumps", "wrap", lambda *a: None, "x", megatron=ANY)
    assert record.kind is Kind.WRAP
    assert f"{record.kind}" == str(record.kind) == "wrap" and record.kind == "wrap"
    with pytest.raises(RecordError, match=r"patch x.bad: kind must be one of \('wrap', 'replace', "
                                          r"'attribute', 'module'\), not 'wrapp'"):
        Patch("x.bad", "json:dumps", "wrapp", lambda *a: None, "x", megatron=ANY)


def test_a_launcher_packages_record_is_gated_on_its_release():
    """``distribution``: the third-party package a target belongs to and the releases the record
    was verified with (dlrover's, nvidia-resiliency-ext's). Another installed release: tried,
    unverified; not installed: nothing to check (its module is never imported); a requirement
    without releases is refused. pluggy stands in for the launcher (a requirement of ours)."""
    from megatron_musa_patch.core.records import RecordError

    installed = versions.distribution_version("pluggy")
    reg = Registry("cpu")
    same = Patch("d.same", "pluggy:PluginManager", "wrap", None, "d", megatron=ANY,
                 distribution=f"pluggy=={installed}")
    other = Patch("d.other", "pluggy:PluginManager", "wrap", None, "d", megatron=ANY,
                  distribution="pluggy==0.0.1")
    absent = Patch("d.absent", "no_such_package_mmp.mod:run", "wrap", None, "d",
                   megatron=ANY, distribution="no-such-package-mmp==1.0")
    assert reg.verdict(same) == ("applied", "")
    assert reg.verdict(other) == ("unverified", f"verified with pluggy ==0.0.1, not the installed "
                                                f"{installed}: re-verify it and move the range")
    assert reg.verdict(absent) == ("applied", "")
    assert reg.resolve(absent) == ("not installed", "no-such-package-mmp is not installed (the "
                                                    "record waits for its import)")
    with pytest.raises(RecordError, match="bad distribution 'pluggy'"):
        Patch("d.bad", "pluggy:x", "wrap", None, "d", megatron=ANY, distribution="pluggy")
