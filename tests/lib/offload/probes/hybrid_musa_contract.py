"""megatron-core's HybridDeviceOptimizer on the MUSA row against the stand-in torch_musa (on
``PYTHONPATH``; contract only, nothing is stepped): the row, whether host copies were asked to
be pinned, its d2h stream's type, the streams created and the placement. Prints
``RESULT<json>``.

Run by tests/lib/offload/test_musa.py."""

import json

import torch
import megatron_musa_patch  # activates the layer: before megatron is imported
import torch_musa
from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer
from megatron_musa_patch.lib.offload import partition
from megatron_musa_patch.lib.offload.counting import placement


def main():
    asked = []
    real_maker = partition.host_tensor_maker
    # records the pin request; the stand-in cannot page-lock, so unpinned copies are made
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


if __name__ == "__main__":
    main()
