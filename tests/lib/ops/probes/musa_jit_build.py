"""The JIT build of csrc/ for MUSA on the stand-in torch_musa (tests/fixtures/fake_musa): prints
``RESULT{json}``, the call its ``musa_extension`` recorded, with the ``.mu`` wrappers' text, the
active torch mapping's adapter and the csrc/ directory built from.

Run by tests/lib/ops/test_kernels_musa_build.py."""

import json
import os

import megatron_musa_patch
from torch_musa.utils import musa_extension

from megatron_musa_patch.lib.ops.kernels import build


def main():
    build.build("musa")
    call = musa_extension.BUILDS[-1]
    call["wrappers"] = {os.path.basename(s): open(s).read() for s in call["sources"]
                        if s.endswith(".mu")}
    call["adapter"] = megatron_musa_patch.active_session().torch_mapping.adapter
    call["csrc"] = str(build.csrc_dir())
    print("RESULT" + json.dumps(call))


if __name__ == "__main__":
    main()
