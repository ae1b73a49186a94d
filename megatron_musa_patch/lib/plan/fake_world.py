"""A whole job seen from one rank, in one process, with no memory allocated and no peer running.

The planner runs the release's own training step for one rank of the planned job: torch's fake
process group (``backend="fake"``) answers every question about ranks and groups for any world
size, and fake tensors (``FakeTensorMode``) carry shapes and dtypes but no data. What neither
covers is changed here, only inside the planning process (``applied``), each change a record
with why it is needed (``RECORDS``; run on torch 2.11 and 2.15 with megatron-core 0.16.1 and
0.19.2):

* collectives are recorded (op, bytes, the group's ranks) and do nothing: fake tensors cannot
  enter torch's coalesced and object collectives, and a planned job's peers do not exist;
* on real tensors (host-side counts), collectives answer as if every rank held this rank's;
* object collectives answer with this rank's own object (Megatron gathers the same parameter
  names and decisions on every rank);
* groups are made on the world's fake backend whatever backend Megatron asks for (gloo groups
  cannot be made on a fake store);
* ``Module._apply`` moves fake parameters with ``.data =``: torch swaps a fake parameter's
  tensor instead, which fails once the fake mode holds a weak reference to it;
* ``scaled_dot_product_attention`` (the layer's flash attention) runs without dropout, and with
  values narrower than the queries (MLA) padded to their width: the planned devices' flash
  kernels drop in-kernel and store nothing of sequence x sequence, but on the planning CPU a
  dropout, or unequal widths, send SDPA to its math path, which stores the fp32 scores.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, List, Tuple

import torch
import torch.distributed as dist

from .kinds import SHARDED, kind_of

#: collective -> (position of the tensor recorded, position of the group): for the gathers and
#: reductions to shards, the shard (what each rank sends per step of a ring); otherwise the whole
COLLECTIVES = {
    "all_reduce": (0, 2), "broadcast": (0, 2), "reduce": (0, 3),
    "send": (0, 2), "recv": (0, 2), "isend": (0, 2), "irecv": (0, 2),
    "all_gather_into_tensor": (1, 2), "_all_gather_base": (1, 2), "all_gather": (1, 2),
    "reduce_scatter_tensor": (0, 3), "_reduce_scatter_base": (0, 3), "reduce_scatter": (0, 3),
    "all_to_all_single": (1, 4), "all_to_all": (1, 2),
}


@dataclasses.dataclass(frozen=True)
class Record:
    """One change the planning process makes to torch."""

    target: str
    why: str


RECORDS = (
    Record("torch.distributed.<collectives>", "recorded, not run: fake tensors cannot enter "
           "torch's coalesced and object collectives and a planned job's peers do not exist"),
    Record("torch.distributed.all_gather_object / broadcast_object_list",
           "answered with this rank's object"),
    Record("torch.distributed.P2POp / batch_isend_irecv / _coalescing_manager",
           "recorded, not run; torch's P2POp accepts only its own isend/irecv"),
    Record("torch.distributed.new_group", "made on the fake backend, whatever Megatron asks"),
    Record("torch.compile", "the function runs eagerly as one fused region of the tracker: a "
           "compiled kernel keeps its intermediates out of memory (dynamo does not trace under "
           "fake tensors)"),
    Record("torch.tensor", "a list of fake scalars (Megatron's gradient norm without apex) is "
           "stacked: torch.tensor reads data a fake tensor does not have"),
    Record("torch.nn.Module._apply", "fake parameters moved with .data = (torch would swap "
           "tensors, which fails on a fake parameter the fake mode holds a weak reference to)"),
)


@dataclasses.dataclass
class Comm:
    op: str
    nbytes: int
    ranks: Tuple[int, ...]
    phase: str
    #: asked for asynchronously (a bucket's reduction overlapping the backward pass)
    overlapped: bool = False


class Recorder:
    """The collectives a planned rank calls, with the phase of the step they fall in."""

    def __init__(self):
        self.comms: List[Comm] = []
        self.phase = "setup"
        self._ranks: Dict[int, Tuple[int, ...]] = {}
        #: the memory tracker compiled regions report to, once the step runs
        self.tracker = None
        #: compiled regions counted op by op, as a run under a dispatch mode executes them
        #: (the benchmark's cross-check against such a run)
        self.compiled_as_eager = False
        #: collective kind -> bytes its backend holds while it runs, per byte of the gathered
        #: or reduced whole (the device profile's ``collective_transient``)
        self.transients: Dict[str, float] = {}

    def ranks_of(self, group) -> Tuple[int, ...]:
        if group is None:
            group = dist.group.WORLD
        key = id(group)
        if key not in self._ranks:
            try:
                self._ranks[key] = tuple(dist.get_process_group_ranks(group))
            except Exception:  # noqa: BLE001 - a group this rank is not in
                self._ranks[key] = ()
        return self._ranks[key]

    def add(self, op: str, tensor, group, overlapped: bool = False) -> None:
        if isinstance(tensor, (list, tuple)):
            nbytes = sum(t.numel() * t.element_size() for t in tensor
                         if isinstance(t, torch.Tensor))
        elif isinstance(tensor, torch.Tensor):
            nbytes = tensor.numel() * tensor.element_size()
        else:
            nbytes = 0
        ranks = self.ranks_of(group)
        self.comms.append(Comm(op, nbytes, ranks, self.phase, overlapped))
        factor = self.transients.get(kind_of(op), 0.0)
        if factor and self.tracker is not None and len(ranks) > 1:
            whole = nbytes * (len(ranks) if kind_of(op) in SHARDED else 1)
            self.tracker.transient(int(factor * whole))


class _Work:
    """What an asynchronous collective returns, already complete."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(None)
        return future


class _P2POp:
    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        self.op, self.tensor, self.peer, self.group = op, tensor, peer, group
        self.tag, self.group_peer = tag, group_peer


def _collective(recorder: Recorder, name: str, where: Tuple[int, int]) -> Callable:
    tensor_at, group_at = where

    def collective(*args, **kwargs):
        tensor = args[tensor_at] if len(args) > tensor_at else next(
            (v for k, v in kwargs.items() if k in ("tensor", "input_tensor", "input",
                                                    "output", "output_tensor")), None)
        group = args[group_at] if len(args) > group_at else kwargs.get("group")
        recorder.add(name, tensor, group, overlapped=bool(kwargs.get("async_op")) and
                     name not in ("isend", "irecv"))
        _symmetric(name, args, len(recorder.ranks_of(group)) or 1)
        if kwargs.get("async_op") or name in ("isend", "irecv"):
            return _Work()
        return None

    collective.__name__ = collective.__qualname__ = name
    return collective


def _symmetric(name: str, args, ranks: int) -> None:
    """On real tensors (a planned rank's host-side counts, such as MoE routing's), the result of
    every rank holding what this one holds: gathers repeat the input, sums multiply it."""
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
    if not tensors or any(isinstance(t, FakeTensor) for t in tensors):
        return
    if name in ("all_gather_into_tensor", "_all_gather_base") and len(tensors) == 2:
        out, shard = tensors
        out.copy_(shard.reshape(-1).repeat(ranks).reshape(out.shape))
    elif name == "all_reduce" and (len(args) < 2 or args[1] in (None, dist.ReduceOp.SUM)):
        tensors[0].mul_(ranks)


def _fake_apply(self, fn, recurse=True):
    if recurse:
        for child in self.children():
            child._apply(fn)
    with torch.no_grad():
        for param in self._parameters.values():
            if param is None:
                continue
            moved = fn(param)
            if moved is not param:
                param.data = moved
            if param.grad is not None:
                grad = fn(param.grad)
                if grad is not param.grad:
                    param.grad.data = grad
        for key, buffer in self._buffers.items():
            if buffer is not None:
                self._buffers[key] = fn(buffer)
    return self


def _tensor_of(made: Callable) -> Callable:
    def tensor(data, *args, **kwargs):
        if not _holds_tensors(data):
            return made(data, *args, **kwargs)
        stacked = _stacked(data)
        dtype = kwargs.get("dtype") or (args[0] if args else None)
        return stacked.to(dtype=dtype or stacked.dtype, device=kwargs.get("device"))

    return tensor


def _holds_tensors(data) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    return isinstance(data, (list, tuple)) and any(_holds_tensors(d) for d in data)


def _stacked(data):
    if isinstance(data, torch.Tensor):
        return data
    return torch.stack([_stacked(d) if _holds_tensors(d) else torch.as_tensor(d)
                        for d in data])


def _compile_for(recorder: Recorder) -> Callable:
    def compile(model=None, **kwargs):
        if model is None:  # @torch.compile(...) with options: a decorator
            return lambda fn: compile(fn, **kwargs)

        def region(*args, **kw):
            if recorder.tracker is None or recorder.compiled_as_eager:
                return model(*args, **kw)
            return recorder.tracker.fused(model)(*args, **kw)

        return region

    return compile


@contextlib.contextmanager
def applied(recorder: Recorder):
    """The records above, for the rest of the planning process (undone on exit)."""
    import torch.distributed.distributed_c10d as c10d

    saved: List[Tuple[object, str, object]] = []

    def put(owner, name, value):
        saved.append((owner, name, getattr(owner, name, None)))
        setattr(owner, name, value)

    for name, where in COLLECTIVES.items():
        if hasattr(dist, name):
            recorded = _collective(recorder, name, where)
            put(dist, name, recorded)
            # the device layer wraps torch's own function here and puts its wrapper in
            # torch.distributed's place: its wrapper then calls the recorder
            if hasattr(c10d, name):
                put(c10d, name, recorded)
    put(dist, "barrier", lambda *args, **kwargs: _Work() if kwargs.get("async_op") else None)
    put(dist, "monitored_barrier", lambda *args, **kwargs: None)

    def all_gather_object(object_list, obj, group=None):
        for i in range(len(object_list)):
            object_list[i] = obj

    put(dist, "all_gather_object", all_gather_object)
    put(dist, "broadcast_object_list", lambda object_list, *args, **kwargs: None)
    put(dist, "gather_object", lambda obj, object_gather_list=None, *a, **k: None)

    def batch_isend_irecv(ops):
        for op in ops:
            recorder.add(getattr(op.op, "__name__", "p2p"), op.tensor, op.group)
        return [_Work() for _ in ops]

    put(dist, "P2POp", _P2POp)
    put(dist, "batch_isend_irecv", batch_isend_irecv)

    @contextlib.contextmanager
    def coalescing_manager(group=None, device=None, async_ops=False):
        yield _Work()

    put(dist, "_coalescing_manager", coalescing_manager)
    put(c10d, "_coalescing_manager", coalescing_manager)
    put(torch.nn.Module, "_apply", _fake_apply)
    put(torch, "tensor", _tensor_of(torch.tensor))
    put(torch, "compile", _compile_for(recorder))
    put(torch.nn.functional, "scaled_dot_product_attention",
        _without_dropout(torch.nn.functional.scaled_dot_product_attention))
    try:
        yield recorder
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _without_dropout(sdpa):
    """SDPA as a device's flash kernel stores it (see the module's doc)."""
    def flash_like(*args, **kwargs):
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        kwargs.pop("dropout_p", None)
        given = dict(zip(("query", "key", "value"), args[:3]))
        given.update({n: kwargs[n] for n in ("query", "value") if n in kwargs})
        query, value = given.get("query"), given.get("value")
        if value is None or query is None or value.shape[-1] >= query.shape[-1]:
            return sdpa(*args, **kwargs)
        # MLA: values narrower than queries (128 against 192); the CPU's flash kernel wants them
        # equal and would fall back to its math path. Padded, it plans the flash kernel a device
        # runs, its products and stored output counted at the query's width.
        width = value.shape[-1]
        padded = torch.nn.functional.pad(value, (0, query.shape[-1] - width))
        if len(args) >= 3:
            args = (*args[:2], padded, *args[3:])
        else:
            kwargs["value"] = padded
        return sdpa(*args, **kwargs)[..., :width]

    return flash_like


def groups_on_fake_backend() -> None:
    """``new_group`` on the world's backend: called after the layer's activation, whose
    ``new_group`` maps backends for the device (its wrapper stays underneath)."""
    made = dist.new_group

    def new_group(*args, **kwargs):
        kwargs["backend"] = None
        kwargs.pop("pg_options", None)
        return made(*args, **kwargs)

    dist.new_group = new_group


def init_fake_world(rank: int, world_size: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)

