"""Sessions for unit tests: the real Session, registry and plugin manager, with chosen plugins,
toggles and patch failures, without activating the layer (nothing is patched)."""

from megatron_musa_patch.device.select import mapping
from megatron_musa_patch.core.plugins import make_manager, toggles
from megatron_musa_patch.core.registry import Registry
from megatron_musa_patch.activation.session import Session
from megatron_musa_patch.core.settings import Settings


def make_session(*plugins, disable=(), only=None, problems=None, device="cpu",
                 settings=None) -> Session:
    """``plugins``: plugin objects with ``FEATURE``; ``problems``: feature -> failure reasons
    the registry reports for it."""
    settings = settings or Settings(disable=tuple(disable), only=only)
    pm = make_manager(settings, builtins=plugins, load_entry_points=False)
    registry = Registry(device, toggles(pm, settings))
    if problems:
        registry.feature_problems = lambda feature: list(problems.get(feature, ()))
    return Session(settings=settings, device=mapping(device), registry=registry, plugins=pm)
