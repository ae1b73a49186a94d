"""Reliability: runs that survive a dead or hung rank, checkpoints a crash cannot spoil, data
checked before it is read. One plugin per concern, each with its own switch (``reliability``
means all of them). The launcher's records (``elastic_agent``, ``dlrover_run``, ``ft_launcher``)
are applied in the launcher's process, not in the ranks (as is
``upstream_fixes.dlrover_numa_options``)."""

import functools

from megatron_musa_patch.lib.elastic import launchers


def supervised_run(feature, launcher: "launchers.Launcher", supervision):
    """``feature``'s record that runs ``launcher``'s job inside ``mmp run``'s supervision."""
    return feature.patch(
        "run", f"{launcher.module}:run", "wrap",
        functools.partial(launchers.run_supervised, launcher, supervision),
        distribution=launcher.distribution,
        why=f"the job runs under mmp run's supervision, named for {launcher.name}")
