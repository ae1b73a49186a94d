"""Built-in features: each module is a pluggy plugin named by its ``FEATURE``.

A feature module declares ``FEATURE`` (its name, used by the toggles), ``REQUIRED`` (device
and collective plumbing that every run needs) and ``DESCRIPTION``, and implements the hooks of
``hookspecs.py`` it needs.
"""

from . import collectives, device_swap, megatron_args, upstream_fixes, training_setup

BUILTIN = (device_swap, collectives, megatron_args, training_setup, upstream_fixes)
