"""The hybrid optimizer on the MUSA row, against the stand-in torch_musa (contract only: the
stand-in cannot allocate device memory, so nothing is stepped).

Its copy streams are torch.musa streams, the device row (not ``Tensor.is_cuda``) decides what is
on the accelerator -- host tensors are not, so nothing of theirs is copied -- and host copies
are to be pinned (the MUSA row has page-locked memory).
"""

import json

import pytest

from tests.conftest import run_python
from tests.device.musa_rows import MAPPINGS, musa_env

CONTRACT = r"""
import json, torch
import megatron_musa_patch
import torch_musa
from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer
from megatron_musa_patch.lib.offload import hybrid, partition
from megatron_musa_patch.lib.offload.counting import placement

asked = []
real_maker = partition.host_tensor_maker
partition.host_tensor_maker = lambda pin: asked.append(pin) or real_maker(False)
params = [torch.randn(8) for _ in range(3)]
hdo = HybridDeviceOptimizer([{"params": params}], offload_fraction=1.0,
                            cpu_optimizer_cls=torch.optim.AdamW,
                            gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True,
                            overlap_cpu_optimizer_d2h_h2d=True, lr=0.1)
print("RESULT" + json.dumps({
    "row": megatron_musa_patch.active_session().device.name, "pin_asked": asked,
    "stream": type(hdo._d2h_stream) is torch_musa.Stream,
    "streams_created": torch_musa.CALLS.count("Stream"),
    "placement": placement(hdo)}))
"""


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_hybrid_optimizer_contract_on_musa(mapping):
    proc = run_python(CONTRACT, env=musa_env(mapping))
    assert "RESULT" in proc.stdout, proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["row"] == "musa" and res["pin_asked"] == [True]
    assert res["stream"] and res["streams_created"] >= 2  # its own d2h and h2d streams
    placed = res["placement"]
    assert placed["host_params"] == 0 and placed["device_params"] == 3, placed
