"""Built-in features: each module is a pluggy plugin named by its ``FEATURE``.

A feature module declares ``FEATURE`` (its name, used by the toggles; dotted inside a group such
as ``fused_ops``), ``REQUIRED`` (device and collective plumbing that every run needs),
``DESCRIPTION`` and optionally ``FLAG_NEEDS``, and implements the hooks of ``hookspecs.py`` it
needs. A group (``fused_ops``, ``upstream_fixes``, ``checkpoint_safety``) is a package whose
``PLUGINS`` are its parts.
"""

from . import (checkpoint_safety, collectives, cpu_offload, cuda_free_startup, data_checks,
               device_swap, flash_attention, fsdp_reduce_unfused, fused_ops, hang_watchdog,
               lazy_gloo_groups, megatron_args, mla_local, mla_q_proj_without_norm, moe_balance_complementary,
               moe_balance_group_score, moe_balance_topk_norm, moe_device_balance, moe_fusion,
               mt_megatron, mtp_flags, recompute, recompute_mla_rms, recompute_mlp_rms,
               release_dropped_groups, restart_store, te_absent, throughput, upstream_fixes)

# pluggy calls hooks last-registered first, so a later plugin's patches are registered and
# applied first: where two features wrap one upstream function, the earlier one here wraps on
# the outside. recompute must stay before moe_fusion: its checkpoint of GroupedMLP.forward then
# re-runs moe_fusion's wrapper (the bf16 assertion bypass) in backward too.
BUILTIN = (device_swap, collectives, release_dropped_groups, lazy_gloo_groups,
           fsdp_reduce_unfused, megatron_args,
           cuda_free_startup, *upstream_fixes.PLUGINS,
           mla_local, mla_q_proj_without_norm, mtp_flags, moe_device_balance,
           moe_balance_complementary, moe_balance_topk_norm, moe_balance_group_score, recompute,
           recompute_mla_rms, recompute_mlp_rms, throughput, cpu_offload,
           *checkpoint_safety.PLUGINS, hang_watchdog, restart_store, data_checks,
           flash_attention, moe_fusion,
           *fused_ops.PLUGINS, te_absent,
           # after moe_device_balance: its aliases are in place before the balance flags are
           # checked (pluggy validates last-registered first)
           *mt_megatron.PLUGINS)
