"""Megatron-LM's own unit tests run through the layer: the device layer's conformance suite.

Runs chosen files of an unpacked Megatron-LM checkout's ``tests/unit_tests`` on N CPU ranks
(torchrun, the layer activated by ``MEGATRON_MUSA_PATCH=1``, or ranks forked from one process),
one file at a time with a timeout per file, and classifies every test: passed, failed (with its
cause and where it belongs), off CUDA by design (needs TransformerEngine, CUDA tensors or CUDA
graphs: it cannot pass on CPU or MUSA), skipped by upstream's own condition, hung or not run (its
file hit the timeout or a rank died). The results of each release go to ``<results>/<tag>.json``;
``docs/conformance.md`` (a summary) and ``<results>/details/<tag>.json`` (every test's verdict and
reason) are generated from every release's results there, never edited by hand.

    python -m tools.conformance --lm-path /path/Megatron-LM-core_v0.16.1            # default set
    python -m tools.conformance --lm-path ... --set ci --nproc 8 --timeout 300       # CI slice
    python -m tools.conformance --lm-path ... --set all --timeout 900   # every test_*.py file
    python -m tools.conformance --lm-path ... tests/unit_tests/tensor_parallel/test_random.py
    python -m tools.conformance --render-only                  # docs/conformance.md again
    python -m tools.conformance --check          # exit 1 if the generated files are stale

``--python`` picks the interpreter (a venv with the package and the release's megatron-core).

The parts: ``tables`` (which files run, and every classification rule: data), ``runner`` (one
file on N ranks, supervised), ``classify`` (a test's verdict from its events), ``render`` (the
summary page and the per-test data files), ``cli`` (the command); ``ranks/`` holds what runs in the ranks (the torchrun
worker and the fork launcher), kept apart so that their directory on ``sys.path`` shadows nothing.
"""
