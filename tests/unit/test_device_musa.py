"""Contract of the MUSA row, against a stand-in torch_musa (tests/fixtures/fake_musa).

No MUSA hardware or torch_musa is available to this project: these tests check that the same
sites the CPU row covers are routed to ``torch.musa`` and ``mccl``, not that kernels run.
"""

import json

import pytest

from ..conftest import FIXTURES, run_python, subprocess_env

CONTRACT = """
import json, torch
import megatron_musa_patch, torch_musa
import torch.distributed as dist
from megatron_musa_patch import active_session as current
from megatron_musa_patch.errors import UnsupportedOnDeviceError

out = {"device": current().device.name}
out["api_is_musa"] = all(getattr(torch.cuda, n) is getattr(torch.musa, n) for n in
    ("current_device", "set_device", "Stream", "Event", "synchronize", "get_rng_state",
     "set_rng_state", "manual_seed", "memory_allocated", "empty_cache", "current_stream"))
out["submodule_is_musa"] = torch.cuda.random.get_rng_state is torch.musa.get_rng_state
out["graph_alias"] = torch.cuda.CUDAGraph is torch.musa.MUSAGraph
try:
    torch.cuda.ExternalStream(0)
except UnsupportedOnDeviceError as exc:
    out["missing_api"] = str(exc)
torch.cuda.set_device(3)
out["current"] = torch.cuda.current_device()
out["devices"] = [str(torch.device("cuda")), str(torch.device("cuda:1")),
                  str(torch.device("cuda", 2)), str(torch.device(0)),
                  str(current().device.translate(5))]
try:
    torch.empty(2, device="cuda")
except Exception as exc:
    out["factory_error"] = str(exc).splitlines()[0]
x = torch.ones(2)
out["cpu_tensor"] = [x.is_cuda, x.type(), torch.Tensor.is_cuda.fget(x)]
import megatron.core.jit as jit
fn = lambda x: x
out["jit_eager"] = jit.jit_fuser(fn) is fn
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
out["backend_seen_by_megatron"] = dist.get_backend()
dist.destroy_process_group()
out["calls"] = torch_musa.CALLS
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def contract():
    env = subprocess_env(PYTHONPATH=str(FIXTURES / "fake_musa"))
    proc = run_python(CONTRACT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_auto_selects_musa_when_torch_musa_imports(contract):
    assert contract["device"] == "musa"


def test_torch_cuda_api_is_torch_musa(contract):
    assert contract["api_is_musa"] and contract["submodule_is_musa"]
    assert contract["graph_alias"], "CUDAGraph must map to torch.musa.MUSAGraph"
    assert "set_device" in contract["calls"] and contract["current"] == 3


def test_names_torch_musa_lacks_fail_clearly(contract):
    assert "torch.cuda.ExternalStream has no counterpart on the musa device" in \
        contract["missing_api"]


def test_cuda_devices_become_musa_devices(contract):
    assert contract["devices"] == ["musa", "musa:1", "musa:2", "musa:0", "musa:5"]
    # the allocation reached the musa backend (the stand-in has no kernels), not CUDA
    assert "'musa' backend" in contract["factory_error"]


def test_is_cuda_means_on_musa_and_host_tensors_keep_their_type(contract):
    is_cuda, type_name, via_property = contract["cpu_tensor"]
    assert (is_cuda, via_property) == (False, False)
    assert type_name == "torch.FloatTensor"


def test_nccl_runs_on_mccl_and_megatron_sees_nccl(contract):
    assert "mccl_backend" in contract["calls"]
    assert contract["backend_seen_by_megatron"] == "nccl"


def test_jit_defaults_to_eager_on_musa(contract):
    assert contract["jit_eager"]
