"""MoE experts with biases (upstream.expert_bias_out_of_place, feature upstream_fixes).

megatron-core's ``MLP.forward`` adds the probability-scaled fc2 bias of an expert in place to the
tensor the tensor-parallel reduction returned, which autograd forbids, so a MoE model with biases
(no --disable-bias-linear) on the local spec fails at its first step, on every device. Through the
layer the bias is added out of place: checked here against the expert's formula written out
(forward and every gradient), on one CPU rank; with the feature off upstream's error comes back.
The stock run is in tests/features/mt_megatron/test_moe_mla_mtp.py."""

import json

import pytest

from tests.conftest import run_probe, subprocess_env

pytestmark = pytest.mark.ranks

PROBE = "tests.features.upstream_fixes.probes.expert_bias"


def _run(**env):
    proc = run_probe(PROBE, timeout=300,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu", **env))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_expert_bias_matches_the_formula():
    result = _run()
    assert "error" not in result, result
    assert result["bias_returned"] is False  # added inside, as upstream means to
    assert "linear_fc2.bias" in result["names"]
    assert result["worst"] < 1e-6, result


def test_upstream_fails_without_the_fix():
    result = _run(MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes")
    assert "is a view and is being modified inplace" in result.get("error", ""), result
