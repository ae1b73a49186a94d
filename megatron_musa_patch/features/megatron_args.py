"""Megatron's command line: plugin argument groups, validation, and configs.

Wraps ``megatron.training.arguments.parse_args`` so every plugin's ``mmp_add_arguments`` runs
on Megatron's own parser (after the script's ``extra_args_provider``), ``validate_args`` so
every plugin's ``mmp_validate_args`` runs before Megatron's checks, and the builders of the
TransformerConfig and OptimizerConfig so plugins carry their flags onto them
(``mmp_transformer_config`` / ``mmp_optimizer_config``). The patch table is logged on rank 0
once the arguments are parsed: by then Megatron's modules are imported.

Before any plugin validates, flags that need a feature which is switched off or whose patches
failed are refused in one place (``check_flag_needs``): the flags each plugin added (given, not
at their default) and those it declares in ``flag_needs``.
"""

from __future__ import annotations

import functools

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.flag_needs import unavailable_errors
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import declaration, feature

FEATURE = feature(
    __name__,
    "plugin argument groups and validation inside Megatron's parse_args/validate_args",
    required=True)


@hookimpl
def mmp_register_patches(session, registry):
    def add(pid, target, impl, why):
        registry.add(FEATURE.patch(pid, target, "wrap",
                                   functools.partial(impl, session), strict=True, why=why))

    add("parse_args", "megatron.training.arguments:parse_args", _parse_args,
        "adds plugin argument groups to Megatron's parser")
    add("validate_args", "megatron.training.arguments:validate_args", _validate_args,
        "plugin flag checks run before Megatron's")
    registry.extend(FEATURE.patches_at(
        "core_transformer_config_from_args", "transformer_config", "wrap",
        functools.partial(_transformer_config, session), strict=True,
        why="plugins carry their flags onto the TransformerConfig"))
    add("optimizer_config", "megatron.training.training:get_megatron_optimizer_config",
        _optimizer_config, "plugins carry their flags onto the OptimizerConfig")


def _parse_args(session, wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    user_provider = call.get("extra_args_provider")

    def provider(parser):
        if user_provider is not None:
            parser = user_provider(parser) or parser
        add_plugin_arguments(session, parser)
        session.argument_defaults = {a.dest: a.default for a in parser._actions}
        session.argument_flags = {o: a.dest for a in parser._actions for o in a.option_strings}
        return parser

    call["extra_args_provider"] = provider
    parsed = wrapped(**call)
    session.log_table_once()
    return parsed


def _validate_args(session, wrapped, instance, args, kwargs):
    megatron_args = call_arguments(wrapped, args, kwargs)["args"]
    check_flag_needs(session, megatron_args)
    session.plugins.hook.mmp_validate_args(args=megatron_args, session=session,
                                           device=session.device)
    return wrapped(*args, **kwargs)


def add_plugin_arguments(session, parser) -> None:
    """Run every plugin's ``mmp_add_arguments`` and remember which flags each one added."""
    session.flag_owners.clear()
    for impl in session.plugins.hook.mmp_add_arguments.get_hookimpls():
        before = len(parser._actions)
        wanted = {"parser": parser, "session": session}
        impl.function(**{name: wanted[name] for name in impl.argnames})
        session.flag_owners.setdefault(impl.plugin_name, []).extend(parser._actions[before:])


def _flag_name(action) -> str:
    return max(action.option_strings, key=len, default=action.dest)


def check_flag_needs(session, args) -> None:
    """Flags in effect whose feature is switched off or broken are an error: one paragraph
    naming every such flag."""
    found = []
    for name, plugin in session.plugins.list_name_plugin():
        declared = declaration(plugin)
        if declared is None:
            continue  # a blocked plugin, or the built-in device choice
        why = session.why_unavailable(name)
        if why is None:
            continue
        for action in session.flag_owners.get(name, ()):
            if getattr(args, action.dest, action.default) != action.default:
                found.append((_flag_name(action), name, why, "", ""))
        for need in declared.flag_needs:
            if need.applies(args, session.device.name):
                found.append((need.flag, name, why, need.because, need.instead))
    if found:
        raise unavailable_errors(found)


def _transformer_config(session, wrapped, instance, args, kwargs):
    config = wrapped(*args, **kwargs)
    megatron_args = call_arguments(wrapped, args, kwargs)["args"]
    session.plugins.hook.mmp_transformer_config(args=megatron_args, config=config,
                                                session=session)
    return config


def _optimizer_config(session, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    config = result[0] if isinstance(result, tuple) else result
    megatron_args = call_arguments(wrapped, args, kwargs)["args"]
    session.plugins.hook.mmp_optimizer_config(args=megatron_args, config=config, session=session)
    return result
