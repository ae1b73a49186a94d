"""Which of the layer's torch-level records torchada already covers, and why the others stay.

Measured on torchada 0.1.103 against the stand-in torch_musa (``tests/fixtures/fake_musa``;
``tests/device/test_torchada_gaps.py`` runs every case with torchada alone, so a torchada release
that closes or opens a gap fails there). Each answer is about one record target
(``module:Qual.name``, the torch name the record patches):

* :func:`covers` returns why torchada maps the target (the record is then skipped), or None;
* :func:`gap` returns why the layer's record is still needed where torchada does not map it.

Where the answer depends on what torch_musa provides (``torch.cuda.X`` exists only where
``torch.musa.X`` does) or on torch itself (integer devices), it is read from the running
process; the rest is the measurement below.
"""

from __future__ import annotations

import sys
import types
from typing import Optional

#: targets torchada maps completely on the musa row (checked by the gap test)
MAPPED = {
    "torch:device": "torch.device('cuda'), ('cuda', i) and 'cuda:i' construct musa devices",
    "torch:Tensor.is_cuda": "Tensor.is_cuda is true for musa tensors (Tensor.is_musa)",
    "torch.nn:Module.cuda": "Module.cuda() moves the module to musa",
    "torch:Generator": "torch.Generator(device='cuda') and integer devices make musa generators",
}

#: targets torchada leaves (not patched, or patched without what Megatron needs)
GAPS = {
    "torch:Tensor.type": "torchada leaves Tensor.type(): Megatron compares it with "
                         "'torch.cuda.FloatTensor', and type('torch.cuda.X') initialises CUDA",
    "torch:Tensor.cuda": "torchada's Tensor.cuda has no memory_format parameter (TypeError); the "
                         "layer's takes its place",
    "torch.amp.autocast_mode:autocast.__init__":
        "torchada rebinds only the torch.amp.autocast attribute; torch.autocast('cuda') (Megatron's "
        "schedules) stays on CUDA",
    "torch.distributed:init_process_group":
        "torchada maps only the exact 'nccl': compound strings ('cpu:gloo,cuda:nccl') and "
        "backend=None stay CUDA's, and its fixed signature refuses torch's newer keywords "
        "(_ranks); the layer's takes its place",
    "torch.distributed:new_group":
        "torchada maps only the exact 'nccl' (not 'cpu:gloo,cuda:nccl') and its fixed signature "
        "refuses torch's newer keywords (sort_ranks); the layer's takes its place",
    "torch.distributed:get_backend": "Megatron compares get_backend() with 'nccl'; torchada "
                                     "leaves it reporting 'mccl'",
}
for _name in ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided"):
    GAPS[f"torch:Tensor.{_name}"] = ("torchada translates device= in torch.* factories, not in "
                                     "Tensor.new_*: device='cuda' there still means CUDA")

_CUDA_SUBMODULES = ("torch.cuda.random", "torch.cuda.memory", "torch.cuda.nvtx")
_INT_DEVICE_TARGETS = ("torch:Tensor.to", "torch.nn:Module.to")


def covers(target: str, torch_type: str) -> Optional[str]:
    """Why torchada maps ``target`` in this process, or None when the layer must."""
    module, _, name = target.partition(":")
    if target in MAPPED:
        return MAPPED[target]
    if target in GAPS:
        return None
    if module == "torch.cuda":
        return _cuda_name(name)
    if module in _CUDA_SUBMODULES:
        return _cuda_submodule(module, name)
    if target in _INT_DEVICE_TARGETS:
        if _int_device_is(torch_type):
            return ("'cuda', torch.device('cuda') and device= through torchada's Tensor.to; "
                    "integer devices already mean the accelerator in this torch")
        return None
    if module == "torch" and "." not in name:
        return _factory(name)
    return None


def gap(target: str, torch_type: str) -> str:
    """Why the layer's record for ``target`` is needed although torchada is active."""
    module, _, name = target.partition(":")
    if target in GAPS:
        return GAPS[target]
    if module == "torch.cuda":
        if name == "is_available":
            return ("torchada keeps torch.cuda.is_available() False on MUSA "
                    "(TORCHADA_FORCE_CUDA_AVAILABLE was not on when it was imported); Megatron "
                    "asserts it")
        return ("torch.musa lacks it, so torchada's torch.cuda raises a bare AttributeError; "
                "the layer gives a portable fallback or an error naming it")
    if module in _CUDA_SUBMODULES:
        found = sys.modules.get(module)
        if found is not None and getattr(found, "__name__", module) != module:
            return (f"`import {module}` gives {found.__name__} (torchada's redirect), which "
                    f"lacks {name}: the layer adds a portable fallback or an error naming it")
        return (f"`import {module}` still gives torch's CUDA module (torchada redirects that "
                f"path only when torch.musa lacks it)")
    if target in _INT_DEVICE_TARGETS:
        return ("this torch reads an integer device as CUDA, and torchada passes integers "
                "through")
    return "not mapped by torchada (not in its measured coverage)"


# ----------------------------------------------------------------------------- live checks


def redirects_torch_cuda() -> bool:
    """torch.cuda is torchada's redirect to torch.musa (a module object of its own type), not
    torch's module: the evidence that torchada mapped this process, whatever it was told."""
    cuda = sys.modules.get("torch.cuda")
    kind = type(cuda)
    return cuda is not None and kind is not types.ModuleType and \
        kind.__module__.split(".")[0] == "torchada"


def _cuda_name(name: str) -> Optional[str]:
    import torch

    if not redirects_torch_cuda():
        return None
    musa = getattr(torch, "musa", None)
    if name == "is_available":
        if musa is not None and torch.cuda.is_available is getattr(musa, "is_available", None):
            return "torch.cuda.is_available is torch.musa.is_available (TORCHADA_FORCE_CUDA_AVAILABLE)"
        return None
    try:
        getattr(torch.cuda, name)
    except AttributeError:
        return None
    return "torchada's torch.cuda redirect resolves it in torch.musa"


def _cuda_submodule(module: str, name: str) -> Optional[str]:
    found = sys.modules.get(module)
    if found is None or getattr(found, "__name__", module) == module or not hasattr(found, name):
        return None
    return f"`import {module}` gives {found.__name__} (torchada's redirect), which has {name}"


def _factory(name: str) -> Optional[str]:
    import torch

    if not redirects_torch_cuda():
        return None
    function = getattr(torch, name, None)
    if function is None or getattr(function, "__wrapped__", None) is None:
        return None
    return "torchada's factory wrapper translates device='cuda'"


def _int_device_is(torch_type: str) -> bool:
    import torch

    try:
        return torch._C.device(0).type == torch_type
    except (RuntimeError, TypeError):
        return False
