"""benchmarks/bench_conformance_file.py's reading of py-spy's stacks (no Megatron needed)."""

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location(
    "bench_conformance_file", REPO / "benchmarks" / "bench_conformance_file.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

RUNNER = ("process 1:\"python worker.py\";<module> (conformance_worker.py:92);"
          "main (_pytest/config/__init__.py:231);pytest_pyfunc_call (_pytest/python.py:187);"
          "_multicall (pluggy/_execution.py:147);TestX.test_resharding (tests/test_x.py:10)")


def test_samples_inside_test_bodies_split_by_what_the_test_called(tmp_path):
    raw = tmp_path / "stacks.txt"
    raw.write_text("\n".join([
        # start-up: not inside a test body
        "process 1:\"python worker.py\";<module> (conformance_worker.py:92);"
        "pth_hook (_megatron_musa_patch_boot.py:35);activate (megatron_musa_patch/x.py:1) 50",
        # upstream's own work
        f"{RUNNER};save (megatron/core/dist_checkpointing/serialization.py:3);"
        "write (torch/x.py:1) 6",
        # upstream's work under a layer wrapper, and the wrapper's own code
        f"{RUNNER};Utils.initialize_model_parallel (tests/test_utilities.py:1);"
        "ModelParallelGroups.record_initialize (megatron_musa_patch/features/r.py:45);"
        "initialize_model_parallel (megatron/core/parallel_state.py:1) 3",
        f"{RUNNER};Utils.initialize_model_parallel (tests/test_utilities.py:1);"
        "ModelParallelGroups.record_initialize (megatron_musa_patch/features/r.py:47) 1",
    ]) + "\n")
    split = bench.split_profile(raw)
    assert split["samples"] == 10
    assert split["calls"] == {"save": 6, "Utils.initialize_model_parallel": 4}
    assert (split["layer_self"], split["layer_under"]) == (1, 4)
