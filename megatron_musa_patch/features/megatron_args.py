"""Megatron's command line: plugin argument groups, validation, and configs.

Each plugin's flags are remembered by owner, so a flag of a feature that is switched off
(``MEGATRON_MUSA_PATCH_DISABLE``/``ONLY``) or whose patches failed is an error naming the flag,
the feature and why, instead of a flag that silently does nothing.

Wraps ``megatron.training.arguments.parse_args`` so every plugin's ``mmp_add_arguments`` runs
on Megatron's own parser (after the script's ``extra_args_provider``), ``validate_args`` so
every plugin's ``mmp_validate_args`` runs before Megatron's checks, and the builders of the
TransformerConfig and OptimizerConfig so plugins carry their flags onto them
(``mmp_transformer_config`` / ``mmp_optimizer_config``). The patch table is logged on rank 0
once the arguments are parsed: by then Megatron's modules are imported.
"""

from __future__ import annotations

from ..errors import FeatureUnavailableError
from ..hookspecs import hookimpl
from ..registry import Patch

#: plugin name -> the argparse actions its mmp_add_arguments added (filled by parse_args)
FLAG_OWNERS = {}

FEATURE = "megatron_args"
REQUIRED = True
DESCRIPTION = "plugin argument groups and validation inside Megatron's parse_args/validate_args"


@hookimpl
def mmp_register_patches(registry, device):
    registry.add(Patch("megatron_args.parse_args", "megatron.training.arguments:parse_args",
                       "wrap", _parse_args, FEATURE, strict=True,
                       why="adds plugin argument groups to Megatron's parser"))
    registry.add(Patch("megatron_args.validate_args", "megatron.training.arguments:validate_args",
                       "wrap", _validate_args, FEATURE, strict=True,
                       why="plugin flag checks run before Megatron's"))
    registry.add(Patch("megatron_args.transformer_config",
                       "megatron.training.arguments:core_transformer_config_from_args", "wrap",
                       _transformer_config, FEATURE, strict=True,
                       why="plugins carry their flags onto the TransformerConfig"))
    registry.add(Patch("megatron_args.optimizer_config",
                       "megatron.training.training:get_megatron_optimizer_config", "wrap",
                       _optimizer_config, FEATURE, strict=True,
                       why="plugins carry their flags onto the OptimizerConfig"))


def _bind(args, kwargs, names):
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def _parse_args(wrapped, instance, args, kwargs):
    from .. import activation

    call = _bind(args, kwargs, ("extra_args_provider", "ignore_unknown_args"))
    user_provider = call.get("extra_args_provider")

    def provider(parser):
        if user_provider is not None:
            parser = user_provider(parser) or parser
        add_plugin_arguments(activation.current().plugins, parser)
        return parser

    call["extra_args_provider"] = provider
    parsed = wrapped(**call)
    activation.log_table_once()
    return parsed


def _validate_args(wrapped, instance, args, kwargs):
    from .. import activation

    state = activation.current()
    call = _bind(args, kwargs, ("args", "defaults"))
    check_unavailable_flags(call["args"], state.registry)
    state.plugins.hook.mmp_validate_args(args=call["args"], device=state.device)
    return wrapped(*args, **kwargs)


def add_plugin_arguments(plugins, parser) -> None:
    """Run every plugin's ``mmp_add_arguments`` and remember which flags each one added."""
    FLAG_OWNERS.clear()
    for impl in plugins.hook.mmp_add_arguments.get_hookimpls():
        before = len(parser._actions)
        impl.function(parser=parser)
        FLAG_OWNERS.setdefault(impl.plugin_name, []).extend(parser._actions[before:])


def check_unavailable_flags(args, registry) -> None:
    """A flag given (not at its default) whose feature is off or broken is an error."""
    for feature, actions in FLAG_OWNERS.items():
        if feature in registry.disabled_features:
            why = "which is switched off (MEGATRON_MUSA_PATCH_DISABLE / MEGATRON_MUSA_PATCH_ONLY)"
            fix = "switch the feature back on, or remove the flag"
        else:
            problems = registry.feature_problems(feature)
            if not problems:
                continue
            why = f"whose patches failed: {problems[0]}"
            fix = "see `mmp doctor`"
        for action in actions:
            if getattr(args, action.dest, action.default) != action.default:
                flag = max(action.option_strings, key=len, default=action.dest)
                raise FeatureUnavailableError(
                    f"{flag} belongs to the feature '{feature}', {why}; {fix}.")


def _transformer_config(wrapped, instance, args, kwargs):
    from .. import activation

    config = wrapped(*args, **kwargs)
    megatron_args = kwargs.get("args", args[0] if args else None)
    activation.current().plugins.hook.mmp_transformer_config(args=megatron_args, config=config)
    return config


def _optimizer_config(wrapped, instance, args, kwargs):
    from .. import activation

    result = wrapped(*args, **kwargs)
    config = result[0] if isinstance(result, tuple) else result
    megatron_args = kwargs.get("args", args[0] if args else None)
    activation.current().plugins.hook.mmp_optimizer_config(args=megatron_args, config=config)
    return result
