"""The V schedules (``--pipeline-v-schedule zb-v|dualpipev``, feature pipeline.v_schedule) on the
stock pretrain_gpt.py (unmodified) on CPU ranks, against megatron-core's own 1F1B, fp32, the
distributed optimizer.

The V places the layers differently from 1F1B, and Megatron draws a rank's initial weights from a
seed of its pipeline rank, so both start from one checkpoint saved by 1F1B after one step (the
distributed checkpoint is layout-free: the V's layers keep their global numbers) and train twenty
steps from it, each with a fresh optimizer. Each parameter's main_grad adds its micro-batches in
1F1B's order with the same kernels (the held-back W of each stage run in micro-batch order), so
the losses are 1F1B's bit for bit without gradient clipping; with it, the gradient norm sums each
rank's share, and the ranks hold other layers, so the clipping factor may differ in its last bit:
within 1e-6 relative. Also: an exact resume of a checkpoint saved under the V, evaluation, and
the timeline against the schedule's own order. Needs MEGATRON_LM_PATH.
"""

import json
import re

import pytest

from megatron_musa_patch.lib.pipeline import v_shape
from tests.harness import stock as runner
from tests.harness.stock import PROBE, probe_steps

pytestmark = [pytest.mark.stock, pytest.mark.slow]

ITERS = 21  # one step by 1F1B into the shared checkpoint, then twenty
#: held-back weight gradients add into main_grad: upstream's --gradient-accumulation-fusion
V_TINY = [a for a in runner.TINY if a != "--no-gradient-accumulation-fusion"]
SHAPE = ["--num-layers", "4", "--micro-batch-size", "1", "--global-batch-size", "8",
         "--use-distributed-optimizer", "--untie-embeddings-and-output-weights"]
LAYOUTS = {
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp4": (4, ["--pipeline-model-parallel-size", "4", "--num-layers", "8"]),
    "pp2-moe-ep2": (4, ["--pipeline-model-parallel-size", "2", "--num-experts", "4",
                        "--moe-router-topk", "2", "--expert-model-parallel-size", "2",
                        "--disable-bias-linear"]),
    "pp2-tp2-sp": (4, ["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size",
                       "2", "--sequence-parallel"]),
    # the buckets reduce after the V's last W, through megatron-core's own grad_sync_func
    "pp2-dp2-overlap": (4, ["--pipeline-model-parallel-size", "2", "--overlap-grad-reduce"]),
}
NO_CLIP = ["--clip-grad", "0"]


def v_flags(schedule):
    return ["--num-virtual-stages-per-pipeline-rank", "2", "--pipeline-v-schedule", schedule]


@pytest.fixture(scope="module")
def runs(lm_path, tmp_path_factory):
    cache = {}

    def get(name, schedule, extra=(), iters=ITERS, start=True):
        """``start``: from the layout's 1F1B checkpoint of step 1, with a fresh optimizer."""
        key = (name, schedule, tuple(extra), iters, start)
        if key not in cache:
            nproc, layout = LAYOUTS[name]
            args = [*SHAPE, *layout, *extra]
            if start:
                args += ["--load", checkpoint(name), "--no-load-optim", "--no-load-rng"]
            if schedule != "1f1b":
                args += v_flags(schedule)
            cache[key] = _run(args, nproc, iters)
        return cache[key]

    def checkpoint(name):
        folder = tmp_path_factory.getbasetemp() / f"v-start-{name}"
        if not folder.exists():
            nproc, layout = LAYOUTS[name]
            _run([*SHAPE, *layout, "--save", str(folder), "--save-interval", "1"], nproc, 1)
        return str(folder)

    def _run(args, nproc, iters):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(runner, "TINY", V_TINY)
            _, _, log = runner.run_stock(lm_path, args, nproc=nproc, iters=iters, env=PROBE)
        return probe_steps(log), log

    return get


def losses(steps, last_rank):
    """{iteration: loss} of the last pipeline rank, where Megatron reports it."""
    found = {i: float(loss) for (r, i), (loss, _) in steps.items() if r == last_rank}
    assert sorted(found) == list(range(2, ITERS + 1)), sorted(found)
    return found


@pytest.mark.parametrize("schedule", [pytest.param("zb-v", marks=pytest.mark.ci), "dualpipev"])
def test_pp2_v_trains_as_1f1b_bit_for_bit_without_clipping(runs, schedule):
    eval_args = ["--eval-interval", "10", "--eval-iters", "1"]
    one_f_one_b, plain_log = runs("pp2", "1f1b", [*NO_CLIP, *eval_args])
    v, log = runs("pp2", schedule, [*NO_CLIP, *eval_args])
    assert re.search(rf"pipeline_v_schedule \.+ {schedule}", log), log[-3000:]
    assert losses(v, 1) == losses(one_f_one_b, 1)
    # evaluation runs the V forward-only and reports on the last rank, as 1F1B does
    said = re.findall(r"validation loss at iteration (\d+) \| lm loss value: (\S+)", log)
    assert said and said == re.findall(r"validation loss at iteration (\d+) \| lm loss value: "
                                       r"(\S+)", plain_log)


@pytest.mark.parametrize("layout,schedule", [("pp4", "zb-v"), ("pp4", "dualpipev"),
                                             ("pp2-moe-ep2", "zb-v"), ("pp2-tp2-sp", "zb-v"),
                                             ("pp2-dp2-overlap", "dualpipev")])
def test_v_trains_as_1f1b_with_clipping(runs, layout, schedule):
    last = LAYOUTS[layout][0] - 1  # the pipeline is the outermost dimension of Megatron's ranks
    reference = losses(runs(layout, "1f1b")[0], last)
    v = losses(runs(layout, schedule)[0], last)
    worst = max(abs(v[i] - reference[i]) / abs(reference[i]) for i in reference)
    assert worst <= 1e-6, (worst, reference, v)


def test_a_checkpoint_saved_under_the_v_resumes_exactly(runs, tmp_path):
    reference, _ = runs("pp2", "zb-v", start=False, iters=20)
    ckpt = ["--save", str(tmp_path / "ckpt"), "--save-interval", "10"]
    first, _ = runs("pp2", "zb-v", [*ckpt, "--exit-interval", "10"], start=False, iters=20)
    second, log = runs("pp2", "zb-v", [*ckpt, "--load", str(tmp_path / "ckpt")], start=False,
                       iters=20)
    assert re.search(r"successfully loaded checkpoint from .* at iteration 10", log), log[-3000:]
    resumed = {**first, **second}
    assert sorted(resumed) == sorted(reference) and len(reference) == 2 * 20
    diff = {k: (reference[k], resumed[k]) for k in reference if reference[k] != resumed[k]}
    assert not diff, f"resumed under the V differs from the uninterrupted run: {diff}"


def test_the_timeline_is_the_schedules_own_order(runs, tmp_path):
    from megatron_musa_patch.lib.pipeline.timeline import misplaced_weight_gradients

    _, log = runs("pp2", "zb-v", ["--pipeline-timeline", str(tmp_path)], start=False, iters=2)
    ranks = 2
    plan = v_shape.orders("zb-v", ranks, 8)
    for rank in range(ranks):
        steps = [json.loads(line) for line in
                 (tmp_path / f"rank{rank:05d}.jsonl").read_text().splitlines()]
        assert [s["iteration"] for s in steps] == [0, 1]
        for step in steps:
            assert step["schedule"] == "zb-v" and step["stage"] == rank
            ops = [op for op in step["ops"] if op["kind"] in ("F", "B", "W")]
            assert misplaced_weight_gradients(step["ops"]) == []
            # the timeline times backward_step as B, whether or not it leaves its W for later
            expected = [("B" if op.kind == "I" else op.kind, v_shape.chunk_of(op.stage, ranks),
                         op.microbatch) for op in plan[rank]]
            assert [(op["kind"], op["chunk"], op["microbatch"]) for op in ops] == expected
    assert re.search(r"pipeline timeline: step 2, zb-v, 8 micro-batches, idle share by stage  "
                     r"0: [0-9.]+ \(theory 0\.[0-9]+\)  1: [0-9.]+", log), log[-3000:]
