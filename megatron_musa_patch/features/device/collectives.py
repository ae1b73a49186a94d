"""Collectives: ``nccl`` means the row's backend (``mccl`` on MUSA, ``gloo`` on CPU).

``--distributed-backend`` accepts ``nccl``, ``mccl`` and ``gloo``; process groups are created
on the mapped backend; on MUSA ``get_backend()`` reports ``nccl`` for ``mccl`` groups so
Megatron's backend-string checks pick the device path, as they do on CUDA.

The records wrap torch's own functions in ``torch.distributed.distributed_c10d`` and put the
wrapper in ``torch.distributed``'s place: on the musa row torchada has replaced
``init_process_group`` / ``new_group`` with wrappers that map only the exact ``"nccl"`` and
refuse torch's newer keywords, so the layer's record takes the place of torchada's instead of
stacking on it (``device/torchada_coverage.py``).

On the CPU row gloo differs from NCCL where Megatron relies on it: a send reads its buffer until
it completes (each ``isend`` owns a copy), ``all_gather_into_tensor`` /
``reduce_scatter_tensor`` want the large tensor in dim-0 chunks of the small one's shape (they
get views of the same storage that are), and ``all_gather`` wants every output of the input's
shape, where NCCL gathers shards of different sizes (Megatron-FSDP's uneven DTensors: gathered
through buffers padded to the largest shard, then copied out). torch's autograd ``all_to_all``
takes a gloo-only path, a loop of scatters that names each source by its rank in the group as if
it were a global rank (so it works on the world group only) and wants one shape for everything a
rank sends; the record sends and receives per peer instead.
"""

from __future__ import annotations

import atexit
import functools

import wrapt

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import CPU, MUSA, OFF_CUDA

FEATURE = feature(
    __name__,
    "nccl mapped to the device's collective backend (mccl on MUSA, gloo on CPU)",
    required=True,
    aliases=("collectives",), kept_out=("device",))


BACKEND_CHOICES = ("nccl", "mccl", "gloo")


@hookimpl
def mmp_register_patches(session, registry, device):
    devices = OFF_CUDA
    why = f"backend 'nccl' runs on {device.backend}"
    records = [
        FEATURE.patch(
            "init_process_group",
            "torch.distributed:init_process_group",
            "replace",
            _over_torch("init_process_group", functools.partial(_init_process_group, device)),
            devices=devices,
            strict=True,
            why=why,
            torch=VERIFIED,
        ),
        FEATURE.patch(
            "new_group",
            "torch.distributed:new_group",
            "replace",
            _over_torch("new_group", functools.partial(_with_backend, device)),
            devices=devices,
            strict=True,
            why=why,
            torch=VERIFIED,
        ),
        # torch's own helpers call distributed_c10d.new_group directly, past the record above
        *(
            FEATURE.patch(
                name,
                f"torch.distributed:{name}",
                "replace",
                _over_torch(name, functools.partial(_with_backend_argument, device)),
                devices=devices,
                strict=True,
                why=f"{why} (HyperCommGrid's groups)",
                torch=VERIFIED,
            )
            for name in ("new_subgroups_by_enumeration", "new_subgroups")
        ),
        FEATURE.patch(
            "get_backend",
            "torch.distributed:get_backend",
            "replace",
            _over_torch("get_backend", functools.partial(_get_backend, device)),
            devices=frozenset({MUSA.name}),
            strict=True,
            condition=lambda: bool(device.backend_alias) or "no backend alias",
            why=f"Megatron's 'nccl' checks hold for {device.backend_alias or 'mccl'}",
            torch=VERIFIED,
        ),
    ]
    registry.extend(session.torch_mapping.arbitrate(records))
    registry.add(
        FEATURE.patch(
            "isend_private_copy",
            "torch.distributed.distributed_c10d:isend",
            "wrap",
            _isend_copy,
            devices=frozenset({CPU.name}),
            strict=True,
            rebind=("torch.distributed",),
            why="gloo reads a send buffer until the send completes; Megatron "
            "frees pipeline outputs right after isend (stream-ordered on GPUs)",
            torch=VERIFIED,
        )
    )
    for name, impl in (("all_gather_into_tensor", _gather_as_gloo_shapes),
                       ("reduce_scatter_tensor", _scatter_as_gloo_shapes)):
        registry.add(
            FEATURE.patch(
                f"{name}_shapes",
                f"torch.distributed.distributed_c10d:{name}",
                "wrap",
                impl,
                devices=frozenset({CPU.name}),
                strict=True,
                rebind=("torch.distributed",),
                why="gloo wants the large tensor in dim-0 chunks of the small one's "
                "shape; NCCL and MCCL take any shapes of the right sizes "
                "(Megatron gathers 2-D shards into flat buffers)",
                torch=VERIFIED,
            )
        )
    registry.add(
        FEATURE.patch(
            "all_gather_uneven",
            "torch.distributed.distributed_c10d:all_gather",
            "wrap",
            _gather_uneven_as_gloo,
            devices=frozenset({CPU.name}),
            strict=True,
            rebind=("torch.distributed",),
            why="gloo wants every output of the input's shape; NCCL gathers shards "
            "of different sizes (Megatron-FSDP's uneven DTensors)",
            torch=VERIFIED,
        )
    )
    registry.add(
        FEATURE.patch(
            "autograd_all_to_all",
            "torch.distributed.nn.functional:_AlltoAll.forward",
            "wrap",
            _all_to_all_point_to_point,
            devices=frozenset({CPU.name}),
            strict=True,
            why="torch's autograd all_to_all on gloo is a loop of scatters that names "
            "each source by its group rank as if it were a global rank (wrong on "
            "any group but the world) and needs one shape for all a rank sends; "
            "NCCL takes any group and sizes (Megatron's dynamic-resolution "
            "context-parallel gather)",
            torch=VERIFIED,
        )
    )


def _over_torch(name, wrapper):
    """``wrapper`` around torch's own ``distributed_c10d.<name>``, whoever replaced the
    ``torch.distributed`` attribute since."""
    from torch.distributed import distributed_c10d

    return wrapt.FunctionWrapper(getattr(distributed_c10d, name), wrapper)


@hookimpl
def mmp_add_arguments(parser):
    action = parser._option_string_actions.get("--distributed-backend")
    if action is not None:
        action.choices = list(BACKEND_CHOICES)
        action.help = ("Collective backend: nccl (mapped to the device's own: mccl on MUSA, gloo "
                       "on CPU), mccl or gloo.")


def _init_process_group(device, wrapped, instance, args, kwargs):
    if args:
        kwargs["backend"] = args[0]
        args = args[1:]
    kwargs["backend"] = device.backend_for(kwargs.get("backend")) or device.backend
    if kwargs.get("device_id") is not None:
        device_id = device.translate(kwargs["device_id"])
        # binding a process group to a device only exists for accelerator backends
        kwargs["device_id"] = None if device.name == CPU.name else device_id
    result = wrapped(*args, **kwargs)
    if kwargs["backend"] == "gloo":
        atexit.register(_destroy_if_initialized)
    return result


def _destroy_if_initialized():
    """A gloo group left alive at interpreter exit aborts the process ('terminate called
    without an active exception') when a peer has already gone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _isend_copy(wrapped, instance, args, kwargs):
    """Send a private copy: the returned work owns it until the send is done, whatever the
    caller does to its own tensor (``deallocate_output_tensor`` swaps its storage)."""
    if args:
        args = (args[0].clone(),) + args[1:]
    else:
        kwargs["tensor"] = kwargs["tensor"].clone()
    return wrapped(*args, **kwargs)


def _gather_as_gloo_shapes(wrapped, instance, args, kwargs):
    """``all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False)``."""
    (output, input_), rest, kwargs = _leading(args, kwargs, ("output_tensor", "input_tensor"))
    group = rest[0] if rest else kwargs.get("group")
    output, input_ = _gloo_shapes(output, input_, group)
    return wrapped(output, input_, *rest, **kwargs)


def _scatter_as_gloo_shapes(wrapped, instance, args, kwargs):
    """``reduce_scatter_tensor(output, input, op=SUM, group=None, async_op=False)``."""
    (output, input_), rest, kwargs = _leading(args, kwargs, ("output", "input"))
    group = rest[1] if len(rest) > 1 else kwargs.get("group")
    input_, output = _gloo_shapes(input_, output, group)
    return wrapped(output, input_, *rest, **kwargs)


def _gather_uneven_as_gloo(wrapped, instance, args, kwargs):
    """``all_gather(tensor_list, tensor, group=None, async_op=False)`` whose outputs differ from
    the input in shape: each rank's tensor travels padded to the largest output's size and is
    copied out into the caller's outputs (a returned work is already complete)."""
    (outputs, input_), rest, kwargs = _leading(args, kwargs, ("tensor_list", "tensor"))
    if all(output.shape == input_.shape for output in outputs):
        return wrapped(outputs, input_, *rest, **kwargs)
    group = rest[0] if rest else kwargs.get("group")
    async_op = rest[1] if len(rest) > 1 else kwargs.get("async_op", False)
    import torch.distributed as dist

    rank = dist.get_rank(group)
    if not 0 <= rank < len(outputs) or outputs[rank].numel() != input_.numel():
        return wrapped(outputs, input_, *rest, **kwargs)  # gloo's own error, as without it
    largest = max(output.numel() for output in outputs)
    padded = input_.new_zeros(largest)
    padded[:input_.numel()] = input_.reshape(-1)
    buffers = [padded.new_empty(largest) for _ in outputs]
    wrapped(buffers, padded, group=group)
    for output, buffer in zip(outputs, buffers):
        output.copy_(buffer[:output.numel()].view(output.shape))
    return _completed_work() if async_op else None


def _all_to_all_point_to_point(wrapped, instance, args, kwargs):
    """``_AlltoAll.forward(ctx, group, outputs, *inputs)`` on gloo: a send and a receive per
    peer, addressed by group rank, so that any group and any sizes go through as on NCCL."""
    import torch.distributed as dist

    ctx, group, outputs, *inputs = args
    if dist.get_backend(group) != dist.Backend.GLOO:
        return wrapped(*args, **kwargs)
    size, mine = dist.get_world_size(group), dist.get_rank(group)
    ctx.group = group
    ctx.input_tensor_size_list = [inputs[i].size() for i in range(size)]
    works = []
    for peer in range(size):
        if peer == mine:
            outputs[peer].copy_(inputs[peer])
            continue
        works.append(dist.isend(inputs[peer].contiguous(), group=group, group_dst=peer))
        works.append(dist.irecv(outputs[peer], group=group, group_src=peer))
    for work in works:
        work.wait()
    return tuple(outputs)


def _completed_work():
    import torch
    from torch._C._distributed_c10d import _create_work_from_future

    future = torch.futures.Future()
    future.set_result(None)
    return _create_work_from_future(future)


def _leading(args, kwargs, names):
    """The named leading arguments, given by position or keyword; the rest as given."""
    kwargs = dict(kwargs)
    args = list(args)
    values = [args.pop(0) if args else kwargs.pop(name) for name in names]
    return values, tuple(args), kwargs


def _gloo_shapes(large, small, group):
    """Views of the same storage that gloo's check accepts: ``large`` as the group's dim-0
    chunks of ``small``'s shape (a 0-d ``small`` as one element). Unchanged where gloo already
    accepts them, where the sizes do not fit, or where only a copy could show ``large`` so:
    gloo then raises its own error, as it would without the layer."""
    import torch.distributed as dist

    size = dist.get_world_size(group)
    if small.dim() == 0:
        small = small.view(1)
    shape = (size * small.shape[0], *small.shape[1:])
    if tuple(large.shape) == shape or large.numel() != small.numel() * size \
            or not large.is_contiguous():
        return large, small
    return large.view(shape), small


def _with_backend(device, wrapped, instance, args, kwargs):
    if "backend" in kwargs:
        kwargs["backend"] = device.backend_for(kwargs["backend"])
    elif len(args) >= 3:  # new_group(ranks, timeout, backend, ...)
        args = args[:2] + (device.backend_for(args[2]),) + args[3:]
    return wrapped(*args, **kwargs)


def _with_backend_argument(device, wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs, defaults=False)
    if call.get("backend") is not None:
        call["backend"] = device.backend_for(call["backend"])
    return wrapped(**call)


def _get_backend(device, wrapped, instance, args, kwargs):
    backend = wrapped(*args, **kwargs)
    return "nccl" if str(backend) == device.backend_alias else backend
