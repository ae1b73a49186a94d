"""Printed figures (megatron_musa_patch.lib.metrics.figures): a few significant digits in plain
decimal notation, and the quickstart's device-peak line that printed every digit of a float."""

import importlib.util
from types import SimpleNamespace

import pytest

from megatron_musa_patch.lib.metrics.figures import percent, significant
from megatron_musa_patch.lib.metrics.peak_flops import Peak

from tests.conftest import REPO


@pytest.mark.parametrize("value, digits, shown", [
    (0.13020214729974966, 4, "0.1302"),   # the quickstart's measured CPU peak
    (989.4, 4, "989.4"),
    (1234.56, 4, "1235"),
    (1762345.6, 4, "1762346"),            # integer digits are never dropped: no 1.762e+06
    (0.000021234, 4, "0.00002123"),       # nor written as an exponent: no 2.123e-05
    (0.5, 4, "0.5"),                      # no trailing zeros
    (128.0, 4, "128"),
    (9.99996, 4, "10"),                   # rounds up a decade: still 4 digits at most
    (0.0999996, 3, "0.1"),
    (-0.00123456, 3, "-0.00123"),
    (0.0, 4, "0"),
])
def test_significant(value, digits, shown):
    assert significant(value, digits) == shown
    if value:
        assert float(shown) == pytest.approx(value, rel=0.5 * 10 ** (1 - digits))


def test_significant_of_what_is_not_a_number():
    assert [significant(v) for v in (float("inf"), float("-inf"), float("nan"))] == \
        ["inf", "-inf", "nan"]


def test_percent_has_three_digits_and_keeps_small_values():
    """A first iteration that compiles kernels on a CPU is slow, not 0.00%."""
    assert [percent(v) for v in (22.871, 100.0, 0.1, 0.04123, 0.0041, 0.0)] == \
        ["22.9%", "100%", "0.1%", "0.0412%", "0.0041%", "0%"]


def load_train_core():
    """examples/quickstart/train_core.py as a module (it imports only the standard library at
    its top, so nothing starts)."""
    path = REPO / "examples" / "quickstart" / "train_core.py"
    spec = importlib.util.spec_from_file_location("quickstart_train_core", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_prints_the_device_peak_rounded():
    train_core = load_train_core()
    opts = SimpleNamespace(layers=4, hidden=128, tp=2)
    measured = Peak(0.13020214729974966, "fp32", "measured: 512x512 fp32 torch.mm, 2 thread(s)")
    line = train_core.startup_line(opts, 2048, 2, "cpu", measured)
    assert line == ("megatron-core path: 4 layers, hidden 128, vocab 2048, TP2 on 2 cpu ranks; "
                    "device peak 0.1302 TFLOP/s (measured: 512x512 fp32 torch.mm, 2 thread(s))")
    unknown = train_core.startup_line(opts, 2048, 2, "cuda", None, "'Tesla T4' is not in the "
                                      "peak table")
    assert unknown.endswith("device peak unknown ('Tesla T4' is not in the peak table), so no "
                            "MFU")
