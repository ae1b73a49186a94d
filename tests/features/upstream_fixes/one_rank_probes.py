"""What the tests running one-rank probes (tests/features/upstream_fixes/probes/) share."""


def apex_or_te_installed():
    """With either, megatron-core builds FusedAdam, which keeps lr and step in its groups."""
    from megatron_musa_patch.upstream.conditions import importable

    return importable("transformer_engine") or importable("apex")
