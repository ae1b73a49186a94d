"""Hung and dead ranks: the per-rank hang watchdog (``watchdog``), what its reports say
(``reports``), and the launcher's side of torch's elastic agent (``agent``: ``mmp run``)."""
