"""The ``mmp`` command (``main``) and what its subcommands start: ``mmp run`` (``launch``, and
``run_worker`` in every rank), ``mmp selftest`` (``selftest``, ``selftest_worker``, and the model
it trains, ``tiny_gpt``)."""
