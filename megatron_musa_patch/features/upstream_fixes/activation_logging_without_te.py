"""Activation logging without TransformerEngine.

``megatron.training.activation_logging`` (from 0.18) matches layers with
``isinstance(module, LINEAR_TYPES)``, a tuple that takes TE's layer classes whenever
``megatron.core.extensions.transformer_engine`` imports them. Without TE that module subclasses
the attributes of a ``MagicMock`` standing in for ``transformer_engine``, so ``TELinear`` and
its siblings are ``MagicMock`` instances, not classes, and every ``register_activation_hooks``
/ ``register_tpe_hooks`` call raises ``isinstance() arg 2 must be a type``: activation logging
fails on every machine without TE (MUSA's included). The fix drops what is not a class from the
types ``_register_hooks`` matches, which leaves torch's and megatron-core's own layer classes.
"""

from __future__ import annotations

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import te_missing
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "activation logging matches megatron-core's layers without TE (TE's are mocks then)")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", "megatron.training.activation_logging:_register_hooks", "wrap",
        _only_classes, condition=te_missing, megatron=">=0.18",
        starts="megatron.training.activation_logging arrives in 0.18",
        why="without TE its TE layer 'classes' are MagicMock instances, which isinstance refuses"))


def _only_classes(wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    call["module_types"] = tuple(t for t in call["module_types"] if isinstance(t, type))
    return wrapped(**call)
