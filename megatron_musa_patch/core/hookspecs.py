"""The plugin contract.

Built-in features and external plugins (entry-point group ``megatron_musa_patch``) implement
these hooks with ``@hookimpl``; a plugin implements only the hooks it needs, and each
implementation takes only the arguments it needs (pluggy passes them by name). Every hook of the
ranks gets ``session`` (``megatron_musa_patch.activation.session.Session``): the settings, the
device, the registry, the plugin manager and per-run state, as pytest hands ``config`` to its
hooks (the launcher's hook gets the launcher's state instead). A plugin binds the
session into the patches it registers (``functools.partial``) rather than looking it up later.

A plugin module also declares itself as ``FEATURE`` (``core.feature``): its name, dotted for a
part of a group (``fused_ops.rope``; the toggles ``MEGATRON_MUSA_PATCH_DISABLE`` / ``ONLY`` take
feature and group names), its one-line description for ``mmp doctor``, whether every run needs it
(device and collective plumbing, kept by ``ONLY``), the Megatron flags that work only through it
(``flag_needs.FlagNeed``, checked in one place when the feature is off or failed) and the
features it is ordered after.

Hook names are checked when plugins are registered: an implementation named like a hook that
does not exist (``mmp_validate_arg``) is an error naming the plugin and the hook.
"""

import pluggy

PROJECT = "megatron_musa_patch"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def mmp_select_device(requested: str, settings):
    """Choose the device row for ``requested`` (``auto`` or a row name).

    Return a row name (``musa``, ``cpu``, ``cuda``) or None to let the next plugin decide. The
    built-in implementation runs last. Raise ``DeviceSelectionError`` for an unusable choice.
    """


@hookspec
def mmp_register_patches(session, registry, device):
    """Add this feature's :class:`~megatron_musa_patch.core.records.Patch` records to ``registry``
    (``session.registry``) for the selected ``device`` (``session.device``).

    Register every record, also those for other devices: the registry skips them (and ``mmp
    doctor`` shows why), so the table is the same on every machine.
    """


@hookspec
def mmp_register_launcher_patches(registry, supervision):
    """Add the records this feature applies in the launcher's process rather than in the ranks:
    ``mmp run``'s, and dlrover-run's or ft_launcher's agent under ``MEGATRON_MUSA_PATCH=1``
    (torch's elastic agent, the launchers' own modules). ``supervision``
    (``lib.elastic.supervision.Supervision``) is the launcher's state: the job it supervises,
    which the records' implementations read (they do nothing while there is none).
    ``mmp doctor`` and ``mmp patches`` list these records as the launcher's.
    """


@hookspec
def mmp_add_arguments(parser, session):
    """Add this feature's argument group to Megatron's ``argparse`` parser.

    Called from Megatron's ``parse_args`` after its own groups, so upstream actions can be
    adjusted too. Flags are stored on Megatron's ``args`` like upstream ones; the session
    remembers which feature added which flag.
    """


@hookspec
def mmp_validate_args(args, session, device):
    """Check this feature's flags before Megatron validates its own; raise ``ArgumentError``.

    The message names the flag and says what to add or remove. Flags that need a feature which
    is off or failed are refused before this hook runs (the declaration's ``flag_needs``).
    """


@hookspec
def mmp_transformer_config(args, config, session):
    """Carry this feature's flags from Megatron's ``args`` onto the ``TransformerConfig`` that
    ``core_transformer_config_from_args`` built (set attributes on ``config``; return nothing).

    Patches read them from the config when called, so megatron-core-only users can set the same
    attributes in code.
    """


@hookspec
def mmp_optimizer_config(args, config, session):
    """The same for the ``OptimizerConfig`` built by Megatron-LM's training loop."""
