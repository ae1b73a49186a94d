"""benchmarks/e2e_gpu.py (issue 10's GPU comparison) without a GPU: its log parsing, the goal
verdicts and the launch commands. tests/benchmarks/test_e2e_gpu_dry_run.py runs it end to end on
the CPU."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2e():
    spec = importlib.util.spec_from_file_location("e2e_gpu", ROOT / "benchmarks" / "e2e_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line(i, ms, tflops, loss):
    return (f" [2026-11-30 06:00:00] iteration {i:>8}/      15 | consumed samples: {16 * i} | "
            f"elapsed time per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): "
            f"{tflops} | learning rate: 3.0E-04 | global batch size:    16 | lm loss: "
            f"{loss:.6E} | loss scale: 1.0 |\n")


def test_parse_takes_medians_after_the_warm_up(e2e):
    log = "".join(_line(i, 1000.0 + (500 if i <= 2 else i), 190.0 + i, 10.0 - i / 10)
                  for i in range(1, 7))
    log += "E2E peak memory allocated (GiB): 37.70\n"
    got = e2e.parse(log, skip=2)
    assert got["iterations_timed"] == [3, 4, 5, 6]
    assert got["ms_per_iteration"] == pytest.approx(1004.5)  # median of 1003..1006
    assert got["tflops"] == pytest.approx(194.5)
    assert got["peak_gib"] == pytest.approx(37.7)
    assert got["losses"][6] == pytest.approx(9.4)


def test_parse_of_a_failed_run_has_no_figures(e2e):
    got = e2e.parse("Traceback ...\n", skip=9)
    assert got["ms_per_iteration"] is None and got["tflops"] is None and got["peak_gib"] is None


def _result(name, ms, peak, losses=None):
    return {"name": name, "rc": 0, "ms_per_iteration": ms, "peak_gib": peak,
            "losses": losses or {1: 10.0, 2: 9.0}}


def test_goal_verdicts(e2e):
    results = [_result("upstream", 1430.0, 37.7), _result("layer-off", 1440.0, 37.7),
               _result("layer", 700.0, 31.0, {1: 10.0, 2: 9.05}),
               _result("layer-recompute", 1000.0, 29.0),
               _result("upstream-full-recompute", 1630.0, 29.0)]
    verdicts = {text.split(":")[0]: (value, verdict) for text, value, verdict in e2e.goals(results)}
    speed = verdicts["layer / upstream throughput >= 2.0"]
    assert speed[0] == pytest.approx(1430 / 700) and speed[1] == "PASS"
    assert verdicts["layer peak memory / upstream's <= 1.0"][1] == "PASS"
    loss = verdicts["layer vs upstream loss, max relative gap per iteration <= 1% (bf16)"]
    assert loss[0] == pytest.approx(0.05 / 9.0) and loss[1] == "PASS"
    assert verdicts["layer-recompute peak / full recompute's <= 1.0"][1] == "PASS"
    assert verdicts["layer-recompute / full recompute throughput >= 1.6"] == (
        pytest.approx(1.63), "PASS")
    assert verdicts["layer-off / upstream iteration time <= 1.01"][1] == "PASS"  # 1.007

    results[2] = _result("layer", 800.0, 40.0)  # 1.79x and more memory: both goals fail
    results[1]["rc"] = 1  # a failed run gives n/a, not a pass
    verdicts = {text.split(":")[0]: verdict for text, _, verdict in e2e.goals(results)}
    assert verdicts["layer / upstream throughput >= 2.0"] == "FAIL"
    assert verdicts["layer peak memory / upstream's <= 1.0"] == "FAIL"
    assert verdicts["layer-off / upstream iteration time <= 1.01"] == "n/a"


def test_routes(e2e):
    upstream = e2e.command("torchrun", "/lm", ["--bf16"], 1)
    assert upstream[1:3] == ["-m", "torch.distributed.run"]
    assert upstream[-3:] == [str(e2e.ENTRY), "/lm/pretrain_gpt.py", "--bf16"]
    layer = e2e.command("mmp", "/lm", ["--bf16"], 1)
    assert layer[1] == "-c" and "boot.cli()" in layer[2] and layer[3] == "run"
    # upstream runs get the --no-* flags its local path needs; the layer's fused runs none
    assert set(e2e.NO_FUSION) <= set(e2e.RUNS["upstream"][1])
    assert not any(f.startswith("--no-") for f in e2e.RUNS["layer"][1])
    env = e2e.run_environment("/lm", {})
    assert env["MEGATRON_LM_PATH"] == "/lm" and env["PYTHONPATH"].split(":")[0] == str(ROOT)
    assert not any(k.startswith("MEGATRON_MUSA_PATCH") for k in env)  # upstream stays upstream
    assert sys.executable == upstream[0]


def test_kernel_build_outcome_decides_the_layer_runs_environment(e2e, tmp_path):
    import subprocess
    import time
    import types

    opts = types.SimpleNamespace(out=str(tmp_path))
    for line, expected in (("cuda: loaded (/x/mmp_kernels.so)", {}),
                           ("cuda: build failed: nvcc exited 1",
                            {"MEGATRON_MUSA_PATCH_KERNELS": "0"})):
        log = open(tmp_path / "e2e_kernels_build.log", "w")
        proc = subprocess.Popen([sys.executable, "-c", f"print({line!r})"], stdout=log)
        assert e2e.finish_kernel_build((proc, log), opts, time.monotonic() + 60) == expected
    # a build still running at the deadline is stopped; the runs use torch ops
    log = open(tmp_path / "e2e_kernels_build.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=log)
    assert e2e.finish_kernel_build((proc, log), opts, time.monotonic() + 1) == {
        "MEGATRON_MUSA_PATCH_KERNELS": "0"}
    assert proc.returncode is not None
