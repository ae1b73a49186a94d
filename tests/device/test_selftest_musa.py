"""``mmp selftest`` on the stand-in MUSA row, with each torch mapping.

The stand-in cannot allocate device memory, so the selftest cannot train there. What it
reaches is checked instead: the 1-rank reference fails at the first allocation,
``model.to("cuda")``, in the musa backend -- through torchada's ``Tensor.to`` or the layer's --
after ``selftest_worker.main`` has set the device, initialised the process group (``nccl``, run
on the stand-in's ``mccl``), seeded (``torch.manual_seed`` goes through ``torch.cuda``) and built
megatron-core's GPT on the host. The layouts on 2 ranks are not reached.
"""

import os
import shutil
import sys

import pytest

from tests.conftest import run_python
from tests.device.musa_rows import MAPPINGS, STAND_IN, musa_env

MMP = shutil.which("mmp", path=os.path.dirname(sys.executable))
#: the Tensor.to that moved the model: torchada's or the layer's
TO_FRAME = {"torchada": "torchada/_patch.py", "builtin": "megatron_musa_patch/device/torch_api.py"}


@pytest.mark.slow
@pytest.mark.parametrize("mapping", MAPPINGS)
def test_selftest_reaches_the_first_device_allocation(mapping, tmp_path):
    # workers start in a temporary directory: the stand-in's path must be absolute
    assert os.path.isabs(STAND_IN)
    proc = run_python(None, args=(MMP, "selftest", "--layouts", "tp2", "--steps", "2",
                                  "--timeout", "240", "--keep", str(tmp_path)),
                      env=musa_env(mapping), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "--save-init" in out and "failed (exit 1)" in out, out[-3000:]  # the reference run
    assert "RuntimeError: PyTorch is not linked with support for musa devices" in out, out[-3000:]
    assert TO_FRAME[mapping] in out, out[-3000:]
    assert "CUDA" not in out.split("failed (exit 1)", 1)[1].split("ChildFailedError")[0]
