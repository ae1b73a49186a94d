"""Reliability: runs that survive a dead or hung rank, checkpoints a crash cannot spoil, data
checked before it is read. One plugin per concern, each with its own switch (``reliability``
means all of them). The launcher's records (``elastic_agent``, ``dlrover_run``, ``ft_launcher``)
are applied in the launcher's process, not in the ranks (as is
``upstream_fixes.dlrover_numa_options``)."""
