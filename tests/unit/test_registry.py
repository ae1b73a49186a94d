"""Registry semantics: kinds, post-import application, gating, failures, undo."""

import importlib
import sys
import textwrap
import types
import uuid

import pytest

from megatron_musa_patch import versions
from megatron_musa_patch.errors import PatchError
from megatron_musa_patch.registry import Patch, Registry

TARGET_SOURCE = """
VALUE = 1

def greet(name="world"):
    return f"hello {name}"

class Base:
    def size(self):
        return 1

class Box(Base):
    def label(self):
        return "box"

    @staticmethod
    def kind():
        return "static"
"""


@pytest.fixture
def fake_module(tmp_path, monkeypatch):
    """A fresh, not yet imported module with a unique name; returns (name, importer)."""
    name = f"mmp_fake_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(TARGET_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, tmp_path
    sys.modules.pop(name, None)


def wrapper_upper(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs).upper()


def test_wrap_applies_when_the_module_is_imported_later(fake_module):
    name, path = fake_module
    reg = Registry("cpu")
    reg.add(Patch("t.greet", f"{name}:greet", "wrap", wrapper_upper, "test"))
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
    reg.add(Patch("t.replace", f"{name}:greet", "replace", lambda name="x": "replaced", "test"))
    reg.add(Patch("t.attr", f"{name}:VALUE", "attribute", 42, "test"))
    reg.add(Patch("t.new", f"{name}:NEW", "attribute", "n", "test", create=True))
    reg.add(Patch("t.method", f"{name}:Box.label", "wrap", wrapper_upper, "test"))
    reg.add(Patch("t.static", f"{name}:Box.kind", "wrap", wrapper_upper, "test"))
    reg.add(Patch("t.inherited", f"{name}:Box.size", "replace", lambda self: 7, "test"))
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
    reg.add(Patch("t.count", f"{name}:greet", "wrap", counting, "test"))
    reg.activate()
    reg.activate()
    reg._on_import(mod)  # a second import notification must not wrap twice
    mod.greet()
    assert calls == [1]
    reg.unpatch()


def test_device_condition_and_disabled_feature_skip_with_reasons(fake_module):
    name, _ = fake_module
    mod = importlib.import_module(name)
    from megatron_musa_patch.toggles import decide

    reg = Registry("cpu", decide({"off": False, "test": False}, ["off"], None))
    reg.add(Patch("t.musa_only", f"{name}:VALUE", "attribute", 2, "test",
                  devices=frozenset({"musa"})))
    reg.add(Patch("t.cond", f"{name}:greet", "replace", len, "test",
                  condition=lambda: "not wanted here"))
    reg.add(Patch("t.disabled", f"{name}:Box", "attribute", None, "off"))
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


def test_a_record_for_another_supported_release_is_skipped_naming_its_range(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)
    installed = str(versions.megatron_core_version())
    reg = Registry("cpu", allow_unverified=False)
    reg.add(Patch("t.later", f"{name}:present", "replace", lambda: "new", "feat",
                  megatron=">=99", outside="upstream changed it later"))
    reg.add(Patch("t.ok", f"{name}:present", "wrap", wrapper_upper, "feat"))
    reg.activate()
    later = reg.result("t.later")
    assert later.status == "skipped"
    assert later.reason == f"for megatron-core >=99, not {installed}: upstream changed it later"
    assert reg.result("t.ok").status == "applied" and mod.present() == "PRESENT"
    assert reg.feature_problems("feat") == []
    reg.unpatch()


def test_a_release_outside_the_table_fails_unless_allowed(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)
    from packaging.version import Version

    reg = Registry("cpu", allow_unverified=False, version_of=lambda module: Version("0.15.0"))
    reg.add(Patch("t.any", f"{name}:present", "wrap", wrapper_upper, "feat"))
    reg.activate()
    failed = reg.result("t.any")
    assert failed.status == "failed" and "feat" in failed.reason and "0.15.0" in failed.reason
    assert "ALLOW_UNVERIFIED=1" in failed.reason and reg.feature_problems("feat") == [failed.reason]
    reg.unpatch()

    strict = Registry("cpu", version_of=lambda module: Version("0.99.0"))
    strict.add(Patch("t.strict", f"{name}:present", "replace", len, "feat", strict=True))
    with pytest.raises(PatchError, match="was verified on megatron-core >=0.16.1,<0.20 "):
        strict.activate()

    # allowed: a newer release is treated as the newest of the table, its records are tried
    tried = Registry("cpu", allow_unverified=True, version_of=lambda module: Version("0.20.1"))
    tried.add(Patch("t.new", f"{name}:present", "wrap", wrapper_upper, "feat"))
    tried.add(Patch("t.old", f"{name}:present", "replace", len, "feat", megatron="<0.17"))
    tried.activate()
    assert tried.result("t.new").status == "applied" and mod.present() == "PRESENT"
    assert tried.result("t.old").status == "skipped"
    tried.unpatch()


def test_variants_of_one_patch_apply_by_release_and_may_not_overlap(monkeypatch):
    name, mod = _megatron_fake(monkeypatch)
    from packaging.version import Version

    reg = Registry("cpu", version_of=lambda module: Version("0.18.2"))
    reg.add(Patch("t.moved", f"{name}:present", "replace", lambda: "old", "feat",
                  megatron=">=0.16.1,<0.18"))
    reg.add(Patch("t.moved", f"{name}:present", "replace", lambda: "new", "feat",
                  megatron=">=0.18,<0.20"))
    with pytest.raises(ValueError, match="overlapping Megatron ranges"):
        reg.add(Patch("t.moved", f"{name}:present", "replace", len, "feat", megatron=">=0.17"))
    reg.activate()
    assert mod.present() == "new"
    rows = [r for r in reg.results() if r.id == "t.moved"]
    assert [(r.variant, r.status) for r in rows] == [(">=0.16.1,<0.18", "skipped"),
                                                     (">=0.18,<0.20", "applied")]
    assert rows[0].reason == "for megatron-core >=0.16.1,<0.18, not 0.18.2"
    assert reg.result("t.moved").variant == ">=0.18,<0.20"
    reg.unpatch()
    assert mod.present() == "present"


def test_missing_target_names_target_feature_and_version(monkeypatch):
    name, _ = _megatron_fake(monkeypatch)
    installed = str(versions.megatron_core_version())
    reg = Registry("cpu")
    reg.add(Patch("t.gone", f"{name}:renamed_upstream", "wrap", wrapper_upper, "myfeature"))
    reg.activate()
    result = reg.result("t.gone")
    assert result.status == "failed"
    for part in (f"{name}:renamed_upstream", "myfeature", installed,
                 "MEGATRON_MUSA_PATCH_DISABLE=myfeature"):
        assert part in result.reason

    strict = Registry("cpu")
    strict.add(Patch("t.gone", f"{name}:renamed_upstream", "wrap", wrapper_upper, "device",
                     strict=True))
    with pytest.raises(PatchError, match="does not exist in the installed Megatron"):
        strict.activate()


def test_known_copies_are_rebound_and_restored(fake_module):
    name, path = fake_module
    user = f"{name}_copy"
    (path / f"{user}.py").write_text(f"from {name} import greet as hello\n")
    mod = importlib.import_module(name)
    copy = importlib.import_module(user)  # imported before the patch: a stale copy
    reg = Registry("cpu")
    reg.add(Patch("t.rebind", f"{name}:greet", "wrap", wrapper_upper, "test", rebind=(user,)))
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
    reg.add(Patch("t.scan", f"{name}:present", "wrap", wrapper_upper, "test"))
    reg.activate()
    assert holder.present() == "PRESENT"
    reg.unpatch()
    assert holder.present() == "present"


def test_module_stand_in_is_served_only_while_needed():
    name = f"mmp_missing_{uuid.uuid4().hex[:8]}"

    def fill(module):
        module.answer = 42

    reg = Registry("cpu")
    reg.add(Patch("t.stand_in", f"{name}:*", "module", fill, "test"))
    reg.activate()
    assert importlib.import_module(name).answer == 42
    reg.unpatch()
    assert name not in sys.modules
    with pytest.raises(ImportError):
        importlib.import_module(name)


def test_bad_records_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        Patch("x", "a:b", "monkey", None, "f")
    with pytest.raises(ValueError, match="module:Qual.name"):
        Patch("x", "a.b", "wrap", None, "f")
    with pytest.raises(ValueError, match="version range"):
        Patch("x", "megatron.core.x:y", "wrap", None, "f", megatron="not a spec")
    reg = Registry("cpu")
    reg.add(Patch("x", "a:b", "wrap", None, "f"))
    with pytest.raises(ValueError, match="twice"):
        reg.add(Patch("x", "a:c", "wrap", None, "f"))
