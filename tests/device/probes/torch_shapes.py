"""Run on one device row (``python -m tests.device.probes.torch_shapes``, the row from the
environment): keep torch's own ``torch.cuda`` objects, activate the layer, then import the torch
submodules megatron-core and users reach, compile a small function, and compare every mapped
``torch.cuda`` name with torch's own. Prints one JSON object (tests/device/test_torch_shapes.py).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

import torch
import torch.cuda.memory
import torch.cuda.nvtx
import torch.cuda.random

from megatron_musa_patch.device import shapes, torch_api

#: what megatron-core, Megatron-LM and a user's script import (torch._dynamo and
#: torch._inductor through torch.compile and megatron.core.jit)
SUBMODULES = (
    "torch._dynamo", "torch._inductor", "torch._inductor.config", "torch.amp",
    "torch.utils.checkpoint", "torch.distributed", "torch.distributed.checkpoint",
    "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.nn.functional",
    "torch.distributed.elastic.multiprocessing", "torch.nn.attention", "torch.profiler",
    "torch.cuda.amp", "torch.testing",
)


def mapped_names():
    """(module, name) of every torch.cuda object the device layer maps."""
    names = [("torch.cuda", n) for n in torch_api.CUDA_API]
    names += [(module, n) for module, ns in torch_api.CUDA_SUBMODULE_API.items() for n in ns]
    names += [("torch.cuda.nvtx", n) for n in torch_api.NVTX_API]
    return names


def main():
    torch_own = {key: getattr(sys.modules[key[0]], key[1], None) for key in mapped_names()}
    import megatron_musa_patch

    session = megatron_musa_patch.activate()
    out = {"device": session.device.name, "adapter": session.torch_mapping.adapter,
           "torch": torch.__version__, "imports": {}, "differences": {}}
    for name in SUBMODULES:
        try:
            importlib.import_module(name)
            out["imports"][name] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out["imports"][name] = f"{type(exc).__name__}: {exc}"
    if os.environ.get("MMP_PROBE_COMPILE", "1") == "0":
        out["compiled"] = "not run"
    else:
        out["compiled"] = compile_small()
    for (module, name), own in torch_own.items():
        ours = getattr(sys.modules[module], name, None)
        problems = shapes.differences(own, ours)
        if problems:
            out["differences"][f"{module}.{name}"] = problems
    print("SHAPES " + json.dumps(out), flush=True)


def compile_small():
    """torch.compile traces a function through dynamo and AOTAutograd on the row's device."""
    try:
        def small(x):
            return torch.nn.functional.gelu(x) * 2 + 1

        x = torch.arange(8, dtype=torch.float32)
        compiled = torch.compile(small, backend="aot_eager", fullgraph=True)
        return bool(torch.equal(compiled(x), small(x)))
    except Exception:  # noqa: BLE001 - reported to the test
        return traceback.format_exc(limit=3)


if __name__ == "__main__":
    main()
