"""Hung and dead ranks: the per-rank hang watchdog (``watchdog``), what its reports say
(``reports``, ``failure_report``), and the launcher's side of a job (``supervision``; what the
launcher's records do to torch's elastic agent, ``agent``, and to other launchers,
``launchers``)."""
