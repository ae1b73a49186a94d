"""The stock Megatron-LM ``pretrain_gpt.py`` (core_v0.16.1, unmodified) on 2 CPU ranks with
upstream's optimizer-offload and precision-aware flags. Needs MEGATRON_LM_PATH.

Tolerance against the run without offload: 1e-5 per logged loss (the log prints 6 decimals; the
hybrid optimizer's fused AdamW and the plain single-tensor AdamW round differently in the last bit,
see tests/features/offload/cpu_offload/test_megatron_core.py). Runs that differ only in where parameters are
stepped, and a resumed job against the uninterrupted one, are compared exactly.
"""

import re

import pytest

from tests.harness.stock import run_stock

pytestmark = pytest.mark.stock

ITERS = 6
TOLERANCE = 1e-5
DISTOPT = ["--use-distributed-optimizer"]
OFFLOAD = [*DISTOPT, "--optimizer-cpu-offload", "--use-precision-aware-optimizer"]
HALF_OVERLAP = [*OFFLOAD, "--optimizer-offload-fraction", "0.5", "--overlap-cpu-optimizer-d2h-h2d"]
TP2 = ["--tensor-model-parallel-size", "2"]
SHARE = re.compile(r"optimizer offload on rank 0: (\d+) of (\d+) parameter shards \((\d+) of "
                   r"(\d+) elements, ([0-9.]+)%\) stepped on the host by (\d+) host optimizer")


@pytest.fixture(scope="module")
def runs(lm_path):
    cache = {}

    def get(name, args, iters=ITERS):
        if name not in cache:
            cache[name] = run_stock(lm_path, args, iters=iters)
        return cache[name]

    return get


def assert_close(losses, reference):
    assert sorted(losses) == sorted(reference), (losses, reference)
    bad = {i: (losses[i], reference[i]) for i in reference
           if abs(losses[i] - reference[i]) > TOLERANCE}
    assert not bad, bad


def host_share(log):
    found = SHARE.findall(log)
    assert found, log[-3000:]
    host, total, host_numel, numel, percent, optimizers = found[-1]
    return int(host), int(total), int(host_numel) / int(numel), int(optimizers)


@pytest.mark.parametrize("name,flags,share", [
    ("f1", OFFLOAD, 1.0),
    pytest.param("f0.5+overlap", HALF_OVERLAP, 0.5, marks=pytest.mark.ci),
])
def test_dp2_offload_matches_the_distributed_optimizer(runs, name, flags, share):
    reference = runs("dp2", DISTOPT)[0]
    losses, _, log = runs(name, flags)
    assert_close(losses, reference)
    host, total, fraction, optimizers = host_share(log)
    assert host > 0 and fraction >= share and (share == 1.0) == (host == total), log[-2000:]
    if "overlap" in name:
        assert optimizers == host  # one host optimizer per parameter shard
    assert re.search(r"optimizer_cpu_offload \.+ True", log)


def test_tp2_half_offloaded_with_overlap(runs):
    reference = runs("tp2", [*TP2, *DISTOPT])[0]
    losses, _, log = runs("tp2-f0.5", [*TP2, *HALF_OVERLAP])
    assert_close(losses, reference)
    host, total, fraction, _ = host_share(log)
    assert 0 < host < total and 0.5 <= fraction < 0.9


@pytest.mark.parametrize("fmt", ["torch_dist", "torch"])
def test_save_and_resume_with_the_state_half_on_the_host(runs, lm_path, tmp_path, fmt):
    continuous = runs("f0.5+overlap", HALF_OVERLAP)[0]
    flags = [*HALF_OVERLAP, "--ckpt-format", fmt]
    ckpt = ["--save", str(tmp_path / "ckpt"), "--save-interval", "3"]
    first, _, _ = run_stock(lm_path, [*flags, *ckpt, "--exit-interval", "3"], iters=ITERS)
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    resumed, _, log = run_stock(lm_path, [*flags, *ckpt, "--load", str(tmp_path / "ckpt")],
                                iters=ITERS)
    assert re.search(r"successfully loaded checkpoint from .* at iteration 3", log), log[-3000:]
    assert first == {i: continuous[i] for i in (1, 2, 3)}
    # every line is its own iteration's loss (upstream_fixes.log_loss_reset): line for line
    assert resumed == {i: continuous[i] for i in (4, 5, 6)}, (resumed, continuous)


def test_bf16_precision_aware_without_te(runs):
    """No TE here: upstream stops with 'requires FusedAdam from TransformerEngine'."""
    bf16 = ["--bf16", *DISTOPT]
    reference = runs("bf16", bf16)[0]
    fp32_state, _, log = runs("bf16-aware", [*bf16, "--use-precision-aware-optimizer"])
    assert fp32_state == reference  # fp32 master and moments: the same single-tensor update
    low, _, log = runs("bf16-aware-16", [
        *bf16, "--use-precision-aware-optimizer", "--main-params-dtype", "fp16",
        "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"])
    assert re.search(r"exp_avg_sq_dtype \.+ torch.bfloat16", log)
    assert low != reference and max(abs(low[i] - reference[i]) for i in low) < 0.05
    assert low[ITERS] < low[1]
    offloaded, _, log = runs("bf16-offload-16", [
        *bf16, *OFFLOAD[1:], "--optimizer-offload-fraction", "0.5",
        "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"])
    assert max(abs(offloaded[i] - reference[i]) for i in offloaded) < 0.05
    assert host_share(log)[2] >= 0.5


@pytest.mark.parametrize("extra,expected", [
    (["--optimizer-cpu-offload", "--use-precision-aware-optimizer"],
     "--optimizer-cpu-offload needs --use-distributed-optimizer"),
    ([*OFFLOAD, "--optimizer-offload-fraction", "0"],
     "--optimizer-offload-fraction 0.0 is outside (0, 1]"),
    ([*DISTOPT, "--use-precision-aware-optimizer", "--bf16", "--exp-avg-sq-dtype", "fp16"],
     "--exp-avg-sq-dtype fp16 (exp_avg_sq_dtype) is not stored safely"),
], ids=["no-distopt", "fraction-0", "fp16-second-moment"])
def test_mistakes_stop_with_one_paragraph(lm_path, extra, expected):
    with pytest.raises(AssertionError) as failed:
        run_stock(lm_path, extra, iters=1)
    message = " ".join(str(failed.value).split())
    assert f"megatron_musa_patch: error: {expected}" in message, message[-2000:]
