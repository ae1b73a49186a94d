"""The plugin contract.

Built-in features and external plugins (entry-point group ``megatron_musa_patch``) implement
these hooks with ``@hookimpl``; a plugin implements only the hooks it needs. Plugin names are
feature names: ``MEGATRON_MUSA_PATCH_DISABLE`` / ``MEGATRON_MUSA_PATCH_ONLY`` and
``MEGATRON_MUSA_PATCH_BLOCK_PLUGINS`` refer to them.
"""

import pluggy

PROJECT = "megatron_musa_patch"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def mmp_select_device(requested: str):
    """Choose the device row for ``requested`` (``auto`` or a row name).

    Return a row name (``musa``, ``cpu``, ``cuda``) or None to let the next plugin decide. The
    built-in implementation runs last. Raise ``DeviceSelectionError`` for an unusable choice.
    """


@hookspec
def mmp_register_patches(registry, device):
    """Add this feature's :class:`~megatron_musa_patch.registry.Patch` records to ``registry``.

    ``device`` is the selected :class:`~megatron_musa_patch.device.base.DeviceRow`. Return
    nothing; records that do not apply on this device are filtered by the registry.
    """


@hookspec
def mmp_add_arguments(parser):
    """Add this feature's argument group to Megatron's ``argparse`` parser.

    Called from Megatron's ``parse_args`` after its own groups, so upstream actions can be
    adjusted too. Flags are stored on Megatron's ``args`` like upstream ones.
    """


@hookspec
def mmp_validate_args(args, device):
    """Check this feature's flags before Megatron validates its own; raise ``ArgumentError``.

    The message names the flag and says what to add or remove.
    """


@hookspec
def mmp_transformer_config(args, config):
    """Carry this feature's flags from Megatron's ``args`` onto the ``TransformerConfig`` that
    ``core_transformer_config_from_args`` built (set attributes on ``config``; return nothing).

    Patches read them from the config when called, so megatron-core-only users can set the same
    attributes in code.
    """


@hookspec
def mmp_optimizer_config(args, config):
    """The same for the ``OptimizerConfig`` built by Megatron-LM's training loop."""
