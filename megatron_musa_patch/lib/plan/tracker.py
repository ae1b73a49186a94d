"""What one rank's step allocates and computes, op by op, under fake tensors.

``Tracker`` is a dispatch mode above the fake mode. It sees every op the release's code runs:

* memory: the bytes of every storage an op creates, live until the storage is freed (a weak
  reference to the storage); the peak is the most ever live at once, which is what an
  allocator's ``max_memory_allocated`` counts (before its rounding, ``rounded``);
* work: each op's floating-point operations (torch's ``flop_counter`` table) and the bytes it
  reads and writes (an indexing op's: the elements it selects; a view's or an allocation's:
  none), added into the current phase (forward, backward, optimizer, ...), so a
  device profile can price them later without running anything again;
* compiled regions (``torch.compile``, which Megatron's ``jit_fuser`` and the layer's fused ops
  use): a fused kernel keeps its intermediates in registers, so inside ``fused`` only what the
  region returns is counted, as one op reading its inputs and writing its outputs;
* sizes that depend on values (``masked_select``, ``nonzero``: MoE's token selection): the
  share of true elements is ``density`` (the planner sets balanced routing's, k of E experts);
* host values: an op whose tensors are all real (counts computed on the host) runs for real;
* values: an op that asks for a fake tensor's value (``.item()``, a branch on a tensor) gets a
  neutral one (no overflow found, a norm of 1): the step's memory and work do not depend on it;
  ``torch.equal`` of fake tensors is True (an attention mask compared with the causal pattern
  is that pattern, as Megatron's data gives it).
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Dict, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: the caching allocator's block granularity (every GPU allocation is a multiple of it)
BLOCK = 512


#: ops whose elements cost more than their bytes on a CPU (transcendentals, reductions over them)
MATH = ("exp", "log", "sigmoid", "silu", "tanh", "gelu", "erf", "softmax", "sqrt", "pow",
        "sin", "cos", "div", "norm")


#: of those, the ones a compiled kernel still computes element by element at a transcendental's
#: rate (a norm's root or a division fuses into the bytes it moves)
TRANSCENDENTAL = ("exp", "log", "sigmoid", "silu", "tanh", "gelu", "erf", "softmax", "sin",
                  "cos")


def _is_math(func, words=MATH) -> bool:
    name = func._overloadpacket.__name__
    return any(word in name for word in words)


def rounded(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK if nbytes else 0


def _grouped_mm_flops(mat_a, mat_b, *args, out_val=None, **kwargs) -> int:
    """``_grouped_mm``'s products: each output element is a dot product over the contracted
    dimension, except with two 2-D operands (a weight gradient), whose groups split the
    contracted dimension and each write a whole [m, n] output."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        return 2 * mat_a.shape[0] * mat_a.shape[1] * mat_b.shape[1]
    return 2 * out_val.numel() * mat_a.shape[-1]


def _cpu_flash_attention_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    """The scores' and the output's products of every query head (key heads shared under GQA),
    as torch's formula for the device kernels counts them (the whole square, causal or not)."""
    b, h, sq, d = query.shape
    return 2 * b * h * sq * key.shape[-2] * (d + value.shape[-1])


def _cpu_flash_attention_backward_flops(grad_out, query, key, value, *args, out_val=None,
                                        **kwargs) -> int:
    """The scores recomputed, then the gradients of the probabilities, values, queries, keys."""
    b, h, sq, d = query.shape
    return 2 * b * h * sq * key.shape[-2] * (3 * d + 2 * value.shape[-1])


#: formulas for ops torch's table lacks in some supported releases: MoE's grouped GEMMs
#: (``--moe-grouped-gemm``); the CPU's flash attention, which the planned step runs for a
#: device's (torch 2.11 has no formula for it)
EXTRA_FLOPS = {"_grouped_mm": _grouped_mm_flops,
               "_scaled_dot_product_flash_attention_for_cpu": _cpu_flash_attention_flops,
               "_scaled_dot_product_flash_attention_for_cpu_backward":
                   _cpu_flash_attention_backward_flops}


def _flop_table():
    from torch.utils.flop_counter import flop_registry

    table = {packet.__name__: formula for packet, formula in flop_registry.items()}
    return {**EXTRA_FLOPS, **table}


#: views whose schema does not say so (``matmul`` returns its result through one)
UNANNOTATED_VIEWS = ("_unsafe_view",)
#: ops that only allocate: their cost is issuing them, whatever their size
ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
#: ops that read or write only the elements an index selects, not the whole tensor indexed
INDEXING = ("index", "index_select", "gather", "embedding", "index_put", "index_put_",
            "_index_put_impl_", "scatter", "scatter_", "scatter_add", "scatter_add_")


def _is_view(func) -> bool:
    if func._overloadpacket.__name__ in UNANNOTATED_VIEWS:
        return True
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    returns = schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


class Tracker(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.peak_rounded = 0
        self.live_rounded = 0
        self.phase = "setup"
        #: per phase: Counter of (flops, bytes, width, math elements, fused) -> how many ops had
        #: them; width: the bits of the op's floating-point inputs (16 or 32), which decides a
        #: device's peak; math elements: for a transcendental op, the elements it computes;
        #: fused: a compiled region (its own kernels, priced at their own rate)
        self.work: Dict[str, Counter] = {}
        self.peak_phase = ""
        #: per phase: how many times the phase was entered (forward: micro-batches x chunks)
        self.calls: Dict[str, int] = {}
        self._storages: Dict[int, weakref.ref] = {}
        self._flops = _flop_table()
        #: the share of true elements a value-dependent selection is given (None: refused)
        self.density: Optional[float] = None
        self._fused_depth = 0
        self._fused_flops = 0
        self._fused_math = False

    # ---------------------------------------------------------------- memory
    def _add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._storages:
            return
        nbytes = storage.nbytes()
        self.live += nbytes
        self.live_rounded += rounded(nbytes)
        if self.live_rounded > self.peak_rounded:
            self.peak_rounded = self.live_rounded
        if self.live > self.peak:
            self.peak = self.live
            self.peak_phase = self.phase

        def freed(_ref, key=key, nbytes=nbytes):
            if self._storages.pop(key, None) is not None:
                self.live -= nbytes
                self.live_rounded -= rounded(nbytes)

        self._storages[key] = weakref.ref(storage, freed)

    def transient(self, nbytes: int) -> None:
        """Bytes held only while a collective runs (gloo's flat buffers): they raise the peak."""
        if self.live + nbytes > self.peak:
            self.peak = self.live + nbytes
            self.peak_phase = self.phase
        self.peak_rounded = max(self.peak_rounded, self.live_rounded + rounded(nbytes))

    def mark(self) -> Tuple[int, int]:
        """The live bytes now (exact, rounded), and a fresh peak from here on."""
        self.peak, self.peak_rounded = self.live, self.live_rounded
        return self.live, self.live_rounded

    # ---------------------------------------------------------------- compiled regions
    def fused(self, fn):
        """``fn`` as one fused kernel: what ``torch.compile`` makes of it."""
        def region(*args, **kwargs):
            self._fused_depth += 1
            if self._fused_depth == 1:
                self._fused_flops, self._fused_math = 0, False
            try:
                out = fn(*args, **kwargs)
            finally:
                self._fused_depth -= 1
            if self._fused_depth == 0:
                for leaf in tree_leaves(out):
                    if isinstance(leaf, torch.Tensor):
                        self._add(leaf)
                self._tally(self._fused_flops, (args, kwargs), out, self._fused_math,
                            fused=True)
            return out

        return region

    # ---------------------------------------------------------------- ops
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            return _value(func, args[0])
        if func is torch.ops.aten.equal.default and not _only_real_tensors(args):
            return True  # see the module's doc: values
        if self.density is not None and func in _SELECTIONS:
            out = _SELECTIONS[func](self.density, *args, **kwargs)
        elif _only_real_tensors((args, kwargs)):
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # host values (MoE counts) stay values
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if self._fused_depth:
            self._fused_flops += self._flops_of(func, args, kwargs, out)
            self._fused_math = self._fused_math or _is_math(func, TRANSCENDENTAL)
            return out
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._add(leaf)
        if func.namespace == "aten" and not _is_view(func):
            self._count(func, args, kwargs, out)
        return out

    def _flops_of(self, func, args, kwargs, out) -> int:
        counter = self._flops.get(func._overloadpacket.__name__)
        if counter is None:
            return 0
        try:
            return int(counter(*args, **kwargs, out_val=out))
        except Exception:  # noqa: BLE001 - a shape the table's formula does not take
            return 0

    def _count(self, func, args, kwargs, out) -> None:
        name = func._overloadpacket.__name__
        if name in ALLOCATIONS:
            self._tally(0, (), (), False)
        elif name in INDEXING:
            self._tally(0, *_selected(name, args, kwargs, out), False)
        else:
            self._tally(self._flops_of(func, args, kwargs, out), (args, kwargs), out,
                        _is_math(func))

    def _tally(self, flops: int, inputs, out, math: bool, fused: bool = False) -> None:
        tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        read = sum(t.numel() * t.element_size() for t in tensors)
        written = sum(t.numel() * t.element_size() for t in outputs)
        width = next((t.element_size() * 8 for t in tensors if t.dtype.is_floating_point), 32)
        elements = max((t.numel() for t in (*tensors, *outputs)), default=0) if math and \
            not flops else 0
        key = (flops, read + written, min(width, 32), elements, int(fused))
        self.work.setdefault(self.phase, Counter())[key] += 1


def _selected(name, args, kwargs, out):
    """An indexing op's traffic, as (what it reads, what it writes): the indices and the elements
    selected, which the output (a gather) or the values (a put, a scatter) hold."""
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if name.startswith(("index_put", "_index_put", "scatter")):
        # the first tensor is the one written into: only its selected elements are touched
        indices = [t for t in tensors[1:] if not t.dtype.is_floating_point]
        values = [t for t in tensors[1:] if t.dtype.is_floating_point]
        return [*indices, *values], values
    indices = [t for t in tensors if not t.dtype.is_floating_point]
    return [*indices, *tree_leaves(out)], out


def _masked_select(density, source, mask):
    numel = torch.broadcast_shapes(source.shape, mask.shape).numel()
    return torch.empty(round(numel * density), dtype=source.dtype, device=source.device)


def _nonzero(density, source):
    return torch.empty(round(source.numel() * density), source.dim(), dtype=torch.long,
                       device=source.device)


_SELECTIONS = {torch.ops.aten.masked_select.default: _masked_select,
               torch.ops.aten.nonzero.default: _nonzero}


def _only_real_tensors(inputs) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    return bool(tensors) and not any(isinstance(t, FakeTensor) for t in tensors)


def _value(func, tensor: torch.Tensor):
    """A real tensor's own value (host-side counts), a fake one's neutral value."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    if isinstance(tensor, FakeTensor):
        return _neutral(tensor)
    with unset_fake_temporarily():
        return func(tensor)


def _neutral(tensor: torch.Tensor):
    if tensor.dtype == torch.bool:
        return False
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return 1.0
    return 1


def storage_bytes(tensors, exclude: Optional[set] = None) -> Tuple[int, set]:
    """Bytes of the distinct storages behind ``tensors`` (minus ``exclude``'s), and their keys."""
    seen = set()
    total = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in seen or (exclude and key in exclude):
            continue
        seen.add(key)
        total += storage.nbytes()
    return total, seen
