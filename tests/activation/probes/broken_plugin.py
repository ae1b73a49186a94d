"""A plugin whose hook fails with an error that is not one of the layer's (a bug, not a
refusal): activation cannot finish."""

from megatron_musa_patch.core.hookspecs import hookimpl


@hookimpl
def mmp_register_patches(session, registry):
    raise RuntimeError("a plugin's own bug")
