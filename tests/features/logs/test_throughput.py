"""The throughput feature in the stock pretrain_gpt.py's training log (2 CPU ranks, TP2):
tokens/s per device and MFU on every iteration line, consistent with upstream's own elapsed time,
and its flags. Needs MEGATRON_LM_PATH."""

import re

import pytest

from tests.harness.stock import run_stock

pytestmark = pytest.mark.stock

LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+) \| "
                  r"tokens/s/device: ([0-9.]+) \| model TFLOP/s/device: ([0-9.e+-]+) \| "
                  r"MFU: ([0-9.]+|n/a)%? \|.*?global batch size: +(\d+) \|")
SEQ, WORLD = 64, 2  # runner.TINY's --seq-length; 2 ranks


def lines(log):
    return [dict(zip(("it", "ms", "tokens", "tflops", "mfu", "batch"), m))
            for m in LINE.findall(log)]


def test_every_iteration_line_has_tokens_per_second_and_mfu(lm_path):
    _, _, log = run_stock(lm_path, ["--tensor-model-parallel-size", "2"], iters=3)
    found = lines(log)
    assert [int(r["it"]) for r in found] == [1, 2, 3], log[-3000:]
    startup = re.search(r"model FLOPs per iteration \(global batch 8\) ([0-9.e+-]+) TFLOP .*"
                        r"upstream's count is the same; device peak ([0-9.e+-]+) TFLOP/s "
                        r"\(fp32, measured", log)
    assert startup, log[-3000:]
    flops, peak = float(startup.group(1)), float(startup.group(2))
    for r in found:
        seconds = float(r["ms"]) / 1000
        # from upstream's own elapsed time and batch: 8 sequences of 64 tokens over 2 devices
        assert float(r["tokens"]) == pytest.approx(int(r["batch"]) * SEQ / seconds / WORLD,
                                                   rel=1e-3)
        assert float(r["tflops"]) == pytest.approx(flops / seconds / WORLD, rel=1e-3)
        assert float(r["mfu"]) == pytest.approx(100 * float(r["tflops"]) / peak, rel=1e-2)


def test_device_peak_flag_sets_the_denominator(lm_path):
    _, _, log = run_stock(lm_path, ["--device-peak-tflops", "0.5"], iters=2)
    assert "device peak 0.5 TFLOP/s (fp32, --device-peak-tflops)" in log
    for r in lines(log):
        assert float(r["mfu"]) == pytest.approx(100 * float(r["tflops"]) / 0.5, abs=0.01)


def test_switching_it_off_and_a_bad_peak(lm_path):
    _, _, log = run_stock(lm_path, ["--no-throughput-log"], iters=1)
    assert "tokens/s/device:" not in log and "megatron_musa_patch throughput:" not in log
    with pytest.raises(AssertionError) as failed:
        run_stock(lm_path, ["--device-peak-tflops", "0"], iters=1)
    assert "megatron_musa_patch: error: --device-peak-tflops must be a positive number" in \
        " ".join(str(failed.value).split())
    with pytest.raises(AssertionError) as failed:  # the flag would do nothing: say so
        run_stock(lm_path, ["--device-peak-tflops", "1"], iters=1,
                  env={"MEGATRON_MUSA_PATCH_DISABLE": "logs.throughput"})
    assert ("megatron_musa_patch: error: --device-peak-tflops needs the feature "
            "'logs.throughput', which is switched off by MEGATRON_MUSA_PATCH_DISABLE=logs.throughput") \
        in " ".join(str(failed.value).split())
