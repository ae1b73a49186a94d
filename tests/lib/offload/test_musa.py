"""The hybrid optimizer on the MUSA row, against the stand-in torch_musa (contract only: the
stand-in cannot allocate device memory, so nothing is stepped).

Its copy streams are torch.musa streams, the device row (not ``Tensor.is_cuda``) decides what is
on the accelerator -- host tensors are not, so nothing of theirs is copied -- and host copies
are to be pinned (the MUSA row has page-locked memory).
"""

import json

import pytest

from tests.conftest import run_probe
from tests.device.musa_rows import MAPPINGS, musa_env

PROBE = "tests.lib.offload.probes.hybrid_musa_contract"


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_hybrid_optimizer_contract_on_musa(mapping):
    proc = run_probe(PROBE, env=musa_env(mapping))
    assert "RESULT" in proc.stdout, proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["row"] == "musa" and res["pin_asked"] == [True]
    assert res["stream"] and res["streams_created"] >= 2  # its own d2h and h2d streams
    placed = res["placement"]
    assert placed["host_params"] == 0 and placed["device_params"] == 3, placed
