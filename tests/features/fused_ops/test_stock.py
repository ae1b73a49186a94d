"""Upstream's fusion defaults on the CPU: the stock pretrain_gpt.py (core_v0.16.1, unmodified) on
2 CPU ranks with NONE of the --no-*-fusion / --no-persist-layer-norm flags (feature fused_ops)
gives the losses of the same run with all of them, and sequence parallelism works with the local
spec. With the feature switched off the run stops at argument validation naming the flags.
Needs MEGATRON_LM_PATH.

Tolerances (relative, on every logged loss of 3 iterations), with what was measured here:
* fp32, GPT defaults (GeLU, LayerNorm, learned positions): 1e-6 -- the only numeric difference
  is the weight-gradient GEMM accumulating into main_grad (addmm_) instead of mm + add;
  measured: equal as logged (6.941247, 6.934595, 6.84712).
* fp32, Llama-style (SwiGLU, RMSNorm, RoPE), with and without --sequence-parallel: 1e-5 -- the
  compiled RMSNorm/SwiGLU/RoPE round differently from torch's eager ops; measured: equal as
  logged (6.939281, 6.928105, 6.798215), sequence parallel too.
* fp32 multi-latent attention (qk layernorm, YaRN-free RoPE), with and without
  --sequence-parallel: 1e-5 (its RoPE takes the unfused path off CUDA; norms and SwiGLU fused).
* bf16 Llama-style: 1e-4 -- like the CUDA kernels, the fused softmax keeps bf16 probabilities
  for backward and the compiled formulas round once; measured: 3.7e-6 at most (6.939268 vs
  6.939242), sequence parallel equal to TP2.
"""

import re

import pytest

from tests.harness import stock as runner
from tests.features.mt_megatron.test_moe_mla_mtp import MLA

pytestmark = pytest.mark.stock

NO_FUSION = ["--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
             "--no-bias-dropout-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
             "--no-rope-fusion", "--no-persist-layer-norm"]
FUSED_TINY = [a for a in runner.TINY if a not in NO_FUSION]
TP2 = ["--tensor-model-parallel-size", "2"]
LLAMA = ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
         "--disable-bias-linear", "--untie-embeddings-and-output-weights"]
SP = ["--sequence-parallel"]
ITERS = 3


def run(lm_path, monkeypatch, args, fused, env=None):
    assert set(NO_FUSION) <= set(runner.TINY), "TINY changed: update NO_FUSION"
    with monkeypatch.context() as m:
        if fused:
            m.setattr(runner, "TINY", FUSED_TINY)
        losses, _, log = runner.run_stock(lm_path, args, iters=ITERS, env=env)
    assert sorted(losses) == list(range(1, ITERS + 1)), log[-3000:]
    return losses, log


def assert_close(fused, reference, rtol):
    worst = max(abs(fused[i] - reference[i]) / abs(reference[i]) for i in reference)
    assert worst <= rtol, f"fused {fused} vs --no-* {reference}: relative {worst:.2e} > {rtol}"


@pytest.mark.parametrize("model,extra,rtol", [
    ("gpt-fp32", [], 1e-6),
    ("llama-fp32", LLAMA, 1e-5),
    ("llama-bf16", LLAMA + ["--bf16"], 1e-4),
    ("mla-fp32", MLA, 1e-5),
])
def test_fusion_defaults_match_no_fusion_flags(lm_path, monkeypatch, model, extra, rtol):
    reference, _ = run(lm_path, monkeypatch, TP2 + extra, fused=False)
    fused, log = run(lm_path, monkeypatch, TP2 + extra, fused=True)
    assert re.search(r"^applied +fused_ops\.norm\.local_norm ", log, re.M), log[-3000:]
    assert_close(fused, reference, rtol)
    if model != "gpt-fp32":  # TP2 + sequence parallelism against TP2 without it
        parallel, _ = run(lm_path, monkeypatch, TP2 + SP + extra, fused=True)
        assert_close(parallel, reference, rtol)


def test_switched_off_names_the_flags(lm_path, monkeypatch):
    with pytest.raises(AssertionError) as failure:
        run(lm_path, monkeypatch, TP2 + LLAMA + ["--bf16"], fused=True,
            env={"MEGATRON_MUSA_PATCH_DISABLE": "fused_ops"})
    message = " ".join(str(failure.value).split())  # the paragraph is wrapped
    for flag in ("--no-gradient-accumulation-fusion", "--no-persist-layer-norm",
                 "--no-masked-softmax-fusion", "--no-rope-fusion"):
        assert f"add {flag}" in message, message[-3000:]
    for fusion in ("wgrad_accumulation", "norm", "softmax", "rope"):  # one paragraph names all
        assert f"needs the feature 'fused_ops.{fusion}'" in message
    # and with the flags the switched-off layer trains as before
    losses, _ = run(lm_path, monkeypatch, TP2 + LLAMA, fused=False,
                    env={"MEGATRON_MUSA_PATCH_DISABLE": "fused_ops"})
    assert len(losses) == ITERS
