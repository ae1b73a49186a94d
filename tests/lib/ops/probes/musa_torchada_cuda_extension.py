"""torchada's CUDAExtension route for csrc/ on the stand-in torch_musa: prints ``RESULT{json}``
with the ``MUSAExtension`` call it made and what torchada's port makes of each source.

Run by tests/lib/ops/test_kernels_musa_build.py."""

import json
import pathlib

# torchada first (importing it maps torch's CUDA names): the CUDAExtension taken next is the
# one it replaced
from torchada.utils.cpp_extension import _port_cuda_source
from torch.utils.cpp_extension import CUDAExtension
from torch_musa.utils import musa_extension

from megatron_musa_patch.lib.ops.kernels import sources


def main():
    csrc = pathlib.Path(sources.csrc_dir())
    CUDAExtension("x", [str(csrc / sources.BINDING_SOURCE)]
                  + [str(csrc / k) for k in sources.KERNEL_SOURCES],
                  include_dirs=[str(csrc / "include")],
                  extra_compile_args={"cxx": sources.CXX_FLAGS, "nvcc": sources.NVCC_FLAGS})
    call = musa_extension.BUILDS[-1]
    files = [sources.BINDING_SOURCE, *sources.KERNEL_SOURCES, *sources.HEADERS]
    ported = {f: _port_cuda_source((csrc / f).read_text()) for f in files}
    print("RESULT" + json.dumps({"call": call, "ported": ported}))


if __name__ == "__main__":
    main()
