"""For every torch name either adapter (torchada or the layer) may patch, which adapters its
object reaches, with torchada imported before the layer, after it, or not at all (``ORDER`` in
the environment: before, after, none), on the stand-in torch_musa. Prints one line
``RESULT<json>``.

Run by tests/device/test_torchada_orders.py."""

import functools
import importlib
import inspect
import json
import os
import sys

# nothing of torch, torchada or the layer at module level: main() imports them in ORDER's order
ADAPTERS = ("torchada", "megatron_musa_patch")


def owner(obj):
    target = obj.func if isinstance(obj, functools.partial) else obj
    target = getattr(target, "fget", target)
    code = getattr(target, "__code__", None)
    try:
        path = code.co_filename if code else inspect.getfile(target)
    except TypeError:  # builtins: torch's own
        return None
    for name in ADAPTERS:
        if os.sep + name + os.sep in path:
            return name
    return None


def reachable(obj, depth=4, seen=None):
    # every object a patched name can call into: __wrapped__ chains (functools, wrapt), wrapt's
    # wrapper, partials, properties and closure cells
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or depth < 0:
        return []
    seen.add(id(obj))
    found = [obj]
    nexts = [getattr(obj, "__wrapped__", None), getattr(obj, "_self_wrapper", None),
             getattr(obj, "func", None), getattr(obj, "fget", None)]
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value) and not isinstance(value, type):
            nexts.append(value)
    for nxt in nexts:
        found += reachable(nxt, depth - 1, seen)
    return found


def adapters(obj):
    return sorted({o for o in map(owner, reachable(obj)) if o})


def provider(name):
    import torch

    value = getattr(torch.cuda, name, None)
    alias = {"CUDAGraph": "MUSAGraph"}.get(name, name)
    if value is not None and value is getattr(torch.musa, alias, object()):
        return ["torch.musa"]
    return adapters(value)


def patched_names():
    import torch
    import torch.distributed as dist
    from megatron_musa_patch.device import torch_api

    names = {"torch.cuda": [type(sys.modules["torch.cuda"]).__module__.split(".")[0]]}
    names.update({f"torch.cuda.{n}": provider(n) for n in torch_api.CUDA_API})
    names.update({f"torch.{n}": adapters(getattr(torch, n)) for n in torch_api.FACTORY_FUNCTIONS
                  if hasattr(torch, n)})
    for n in ("to", "cuda", "type", "is_cuda", *torch_api.TENSOR_DEVICE_METHODS):
        names[f"Tensor.{n}"] = adapters(vars(torch.Tensor).get(n))
    for n in ("to", "cuda"):
        names[f"Module.{n}"] = adapters(vars(torch.nn.Module).get(n))
    names["torch.device"] = adapters(torch.device)
    names["autocast_mode.autocast.__init__"] = adapters(
        vars(torch.amp.autocast_mode.autocast)["__init__"])
    names["torch.amp.autocast"] = adapters(torch.amp.autocast)
    for n in ("init_process_group", "new_group", "get_backend"):
        names[f"torch.distributed.{n}"] = adapters(getattr(dist, n))
    for module in ("torch.cuda.random", "torch.cuda.memory", "torch.cuda.nvtx"):
        names[f"import {module}"] = [sys.modules[module].__name__]
    return names


def main():
    order = os.environ["ORDER"]
    if order == "before":
        importlib.import_module("torchada")
    import megatron_musa_patch
    import torch

    names = patched_names()
    ids = {k: id(v) for k, v in vars(torch.Tensor).items()}
    if order == "after":
        importlib.import_module("torchada")
        names["unchanged by a later import torchada"] = [
            k for k, v in vars(torch.Tensor).items() if ids.get(k) != id(v)] == []
    session = megatron_musa_patch.active_session()
    names["adapter"] = session.torch_mapping.adapter
    names["origin"] = getattr(session.torch_mapping, "origin", None)
    names["is_available"] = torch.cuda.is_available()
    names["is_available record"] = session.registry.result(
        "device.torch_cuda.is_available").status
    print("RESULT" + json.dumps(names))


if __name__ == "__main__":
    main()
