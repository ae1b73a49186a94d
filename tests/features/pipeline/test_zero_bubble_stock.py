"""ZB-H1 (``--enable-zero-bubble``, feature pipeline.zero_bubble) on the stock pretrain_gpt.py
(unmodified) on CPU ranks against megatron-core's own 1F1B, 20 steps each, fp32, the distributed
optimizer: every rank's loss and parameters after every step are 1F1B's bit for bit. The
weight-gradient GEMMs held back run oldest first, so each parameter's main_grad adds its
micro-batches in 1F1B's order with the same kernel; nothing else changes order. Also: the
schedule's timeline (W after its own B, W in the cool-down's waits, idle shares against 1F1B's)
and an exact resume of a checkpoint saved under ZB-H1. Needs MEGATRON_LM_PATH.
"""

import json
import re

import pytest

from tests.harness import stock as runner
from tests.harness.stock import PROBE, probe_steps

pytestmark = [pytest.mark.stock, pytest.mark.slow]

ITERS, HALF = 20, 10
#: held-back weight gradients add into main_grad: upstream's --gradient-accumulation-fusion
ZB_TINY = [a for a in runner.TINY if a != "--no-gradient-accumulation-fusion"]
#: 4 layers (PP 4), 8 micro-batches of 1 per step
SHAPE = ["--num-layers", "4", "--micro-batch-size", "1", "--global-batch-size", "8",
         "--use-distributed-optimizer"]
LAYOUTS = {
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp4": (4, ["--pipeline-model-parallel-size", "4"]),
    # MoE: experts split over 2 of the data-parallel ranks of each stage
    "pp2-moe-ep2": (4, ["--pipeline-model-parallel-size", "2", "--num-experts", "4",
                        "--moe-router-topk", "2", "--expert-model-parallel-size", "2",
                        "--disable-bias-linear"]),
    "pp2-tp2-sp": (4, ["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size",
                       "2", "--sequence-parallel"]),
    # the buckets reduce during the last backward pass: every held W runs before it
    "pp2-dp2-overlap": (4, ["--pipeline-model-parallel-size", "2", "--overlap-grad-reduce"]),
}
ZB = ["--enable-zero-bubble"]


@pytest.fixture(scope="module")
def runs(lm_path, tmp_path_factory):
    cache = {}

    def get(name, schedule, extra=(), iters=ITERS):
        key = (name, schedule, tuple(extra), iters)
        if key not in cache:
            nproc, layout = LAYOUTS[name]
            args = [*SHAPE, *layout, *(ZB if schedule == "zb-h1" else []), *extra]
            with pytest.MonkeyPatch.context() as m:
                m.setattr(runner, "TINY", ZB_TINY)
                _, _, log = runner.run_stock(lm_path, args, nproc=nproc, iters=iters, env=PROBE)
            cache[key] = probe_steps(log), log
        return cache[key]

    return get


def assert_same_steps(reference, other, ranks):
    assert sorted({r for r, _ in reference}) == list(range(ranks)), sorted(reference)
    assert len(reference) == ranks * ITERS and sorted(other) == sorted(reference)
    diff = {k: (reference[k], other[k]) for k in reference if reference[k] != other[k]}
    assert not diff, f"ZB-H1 differs from 1F1B: {dict(list(diff.items())[:6])}"


@pytest.mark.ci
def test_zb_h1_trains_pp2_as_1f1b_bit_for_bit(runs):
    one_f_one_b, _ = runs("pp2", "1f1b")
    zero_bubble, log = runs("pp2", "zb-h1")
    assert re.search(r"enable_zero_bubble \.+ True", log), log[-3000:]
    assert_same_steps(one_f_one_b, zero_bubble, 2)


@pytest.mark.parametrize("layout", ["pp4", "pp2-moe-ep2", "pp2-tp2-sp", "pp2-dp2-overlap"])
def test_zb_h1_trains_as_1f1b_bit_for_bit(runs, layout):
    one_f_one_b, _ = runs(layout, "1f1b")
    zero_bubble, _ = runs(layout, "zb-h1")
    assert_same_steps(one_f_one_b, zero_bubble, LAYOUTS[layout][0])


def test_a_checkpoint_saved_under_zb_h1_resumes_exactly(runs, tmp_path):
    reference, _ = runs("pp2", "zb-h1")
    ckpt = ["--save", str(tmp_path / "ckpt"), "--save-interval", str(HALF)]
    first, _ = runs("pp2", "zb-h1", [*ckpt, "--exit-interval", str(HALF)])
    second, log = runs("pp2", "zb-h1", [*ckpt, "--load", str(tmp_path / "ckpt")])
    assert re.search(rf"successfully loaded checkpoint from .* at iteration {HALF}", log), \
        log[-3000:]
    resumed = {**first, **second}
    assert sorted(resumed) == sorted(reference)
    diff = {k: (reference[k], resumed[k]) for k in reference if reference[k] != resumed[k]}
    assert not diff, f"resumed under ZB-H1 differs from the uninterrupted run: {diff}"


def _timelines(folder):
    by_rank = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        by_rank[int(path.stem[4:])] = [json.loads(line) for line in path.read_text().splitlines()]
    return by_rank


def test_the_timeline_shows_w_in_the_slots_1f1b_leaves_idle(runs, tmp_path):
    from megatron_musa_patch.lib.pipeline.timeline import misplaced_weight_gradients

    one_f_one_b, plain_log = runs("pp4", "1f1b", ["--pipeline-timeline", str(tmp_path / "1f1b")],
                                  iters=4)
    zero_bubble, zb_log = runs("pp4", "zb-h1", ["--pipeline-timeline", str(tmp_path / "zb")],
                               iters=4)
    plain, zb = _timelines(tmp_path / "1f1b"), _timelines(tmp_path / "zb")
    assert sorted(plain) == sorted(zb) == [0, 1, 2, 3]
    for rank, steps in zb.items():
        assert [s["iteration"] for s in steps] == [0, 1, 2, 3]
        for step in steps:
            assert step["schedule"] == "zb-h1" and step["stage"] == rank
            ops = step["ops"]
            assert misplaced_weight_gradients(ops) == []
            backwards = [op["microbatch"] for op in ops if op["kind"] == "B"]
            weights = [op["microbatch"] for op in ops if op["kind"] == "W"]
            assert backwards == list(range(8))
            # each W runs after its own pass, oldest first
            assert weights == list(range(8))
            # each B's input gradient is sent before its W runs
            after_b = [ops[i + 1]["kind"] for i, op in enumerate(ops) if op["kind"] == "B"]
            assert all(kind.startswith("send_backward") for kind in after_b), after_b
            # in the cool-down the last pass's W runs before each wait for a gradient
            waits = [i for i, op in enumerate(ops) if op["kind"] == "recv_backward"]
            assert len(waits) == 3 - rank
            assert all(ops[i - 1]["kind"] == "W" for i in waits)
    for steps in plain.values():
        assert all(s["schedule"] == "1f1b" and not [o for o in s["ops"] if o["kind"] == "W"]
                   for s in steps)
    # the summary line: every stage's idle share and its theoretical bubble, each step
    said = re.findall(r"pipeline timeline: step (\d+), zb-h1, 8 micro-batches, idle share by "
                      r"stage  0: [0-9.]+ \(theory [0-9.]+\)  1: .*  3: [0-9.]+", zb_log)
    assert said == ["1", "2", "3", "4"], zb_log[-3000:]
    assert "pipeline timeline: step 1, 1f1b," in plain_log
