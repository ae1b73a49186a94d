"""Built-in features: each module is a pluggy plugin named by its ``FEATURE``.

A feature module declares ``FEATURE`` (its name, used by the toggles), ``REQUIRED`` (device
and collective plumbing that every run needs) and ``DESCRIPTION``, and implements the hooks of
``hookspecs.py`` it needs.
"""

from . import (checkpoint_safety, collectives, cpu_offload, data_checks, device_swap,
               flash_attention, fused_ops, megatron_args, mla_local, moe_device_balance, moe_fusion,
               mtp_flags, recompute, throughput, training_setup, upstream_fixes)

BUILTIN = (device_swap, collectives, megatron_args, training_setup, upstream_fixes, mla_local,
           mtp_flags, moe_device_balance, recompute, throughput, cpu_offload, checkpoint_safety,
           data_checks, flash_attention, moe_fusion, fused_ops)
