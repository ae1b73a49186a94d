"""pluggy checks the plugins: a hook implementation whose name is not a hook of the contract (a
typo that would never be called) is an error naming the plugin and the hook."""

import pytest

from megatron_musa_patch.base.errors import PluginError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import Feature
from megatron_musa_patch.core.plugins import make_manager
from megatron_musa_patch.core.settings import Settings


class Misspelt:
    FEATURE = "misspelt"

    @hookimpl
    def mmp_validate_arg(self, args):  # the contract's hook is mmp_validate_args
        raise AssertionError("never called")


class UnmarkedTypo:
    FEATURE = "unmarked"

    def mmp_register_patch(self, registry):  # no @hookimpl and a typo: pluggy ignores it
        pass


class Fine:
    FEATURE = "fine"

    @hookimpl
    def mmp_validate_args(self, args):
        pass

    def helper(self):
        pass


@pytest.mark.parametrize("plugin,name,close", [
    (Misspelt(), "mmp_validate_arg", "mmp_validate_args"),
    (UnmarkedTypo(), "mmp_register_patch", "mmp_register_patches"),
])
def test_an_unknown_hook_name_is_an_error(plugin, name, close):
    with pytest.raises(PluginError) as caught:
        make_manager(Settings(), builtins=(plugin,), load_entry_points=False)
    text = str(caught.value)
    assert f"plugin '{plugin.FEATURE}' defines {name}, which is not a hook" in text
    assert f"did you mean {close}?" in text


def test_a_plugin_keeping_the_contract_registers():
    pm = make_manager(Settings(), builtins=(Fine(),), load_entry_points=False)
    assert pm.get_plugin("fine") is not None


def test_every_builtin_feature_keeps_the_contract():
    from megatron_musa_patch.features import BUILTIN

    pm = make_manager(Settings(), BUILTIN, load_entry_points=False)
    names = [name for name, _ in pm.list_name_plugin()]
    assert len(names) == len(set(names)) == len(BUILTIN)
    for module in BUILTIN:
        assert isinstance(module.FEATURE, Feature), module.__name__
        assert module.FEATURE.name and module.FEATURE.description
        assert isinstance(module.FEATURE.required, bool)
