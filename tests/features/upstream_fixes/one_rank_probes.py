"""What the tests running one-rank probes (tests/features/upstream_fixes/probes/) share."""

from tests.conftest import run_probe, subprocess_env


def run_probe_on_one_cpu_rank(module, tmp_path, *args, **env):
    """Run probe ``module`` on the CPU row, its file store (``sys.argv[1]``) in ``tmp_path``
    and ``args`` after it; ``env`` adds variables (a ``MEGATRON_MUSA_PATCH_DISABLE``, say)."""
    return run_probe(module, tmp_path / "store", *args,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu", **env))


def apex_or_te_installed():
    """With either, megatron-core builds FusedAdam, which keeps lr and step in its groups."""
    from megatron_musa_patch.upstream.conditions import importable

    return importable("transformer_engine") or importable("apex")
