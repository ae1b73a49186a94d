"""Tokens/s per device and MFU in Megatron-LM's training log.

Two wraps in ``megatron.training.training``:

* ``train``: before the loop starts (and its interval timer with it) the FLOPs of the model are
  counted from ``args`` (``megatron_musa_patch.lib.metrics.flops``) and the device's peak is resolved
  (``--device-peak-tflops``, else the peak table, else on the CPU a short GEMM benchmark run by
  all ranks together); rank 0 prints both once, with upstream's own count beside ours.
* ``print_rank_last`` as ``training_log`` calls it: the iteration line gets
  ``tokens/s/device``, ``model TFLOP/s/device`` and ``MFU`` right after upstream's
  ``elapsed time per iteration (ms)``, computed from that same elapsed time and the line's
  ``global batch size``. Other messages pass unchanged.

Reading the two numbers off the line keeps the new fields consistent with upstream's timing
(its interval timer is reset inside ``training_log``, so it cannot be read afterwards).
"""

from __future__ import annotations

import copy
import functools
import re
import sys
from typing import Optional

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.args import args_read_by
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import CPU
from megatron_musa_patch.lib.metrics.figures import percent, significant

FEATURE = feature(
    __name__,
    "tokens/s per device and MFU in the training log (FLOPs counted for the model)",
    aliases=("throughput",))


TRAINING = "megatron.training.training"
ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+) \|")
BATCH = re.compile(r"global batch size: +(\d+) \|")

@hookimpl
def mmp_register_patches(session, registry, device):
    # what ``train`` resolves for the log lines of this run: args, peak (Peak or None), why none
    resolved = session.state_for(FEATURE.name)
    registry.add(FEATURE.patch(
        "train", f"{TRAINING}:train", "wrap",
        functools.partial(_train, resolved, device),
        why="count the model's FLOPs and resolve the device peak before the training loop"))
    registry.add(FEATURE.patch(
        "log_line", f"{TRAINING}:print_rank_last", "wrap",
        functools.partial(_print_rank_last, resolved),
        why="add tokens/s/device, model TFLOP/s/device and MFU to the iteration log line"))


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("throughput and MFU (megatron_musa_patch)")
    group.add_argument(
        "--device-peak-tflops", type=float, default=None,
        help="Peak dense TFLOP/s of one device in the training dtype, the denominator of MFU. "
             "Default: the peak table (MUSA S4000/S5000, NVIDIA A100/H100/H200/...), or on the "
             "CPU a short matrix-multiply benchmark at start-up.")
    group.add_argument(
        "--no-throughput-log", dest="throughput_log", action="store_false",
        help="Do not add tokens/s/device and MFU to the training log.")


@hookimpl
def mmp_validate_args(args):
    peak = getattr(args, "device_peak_tflops", None)
    if peak is not None and not peak > 0:
        raise ArgumentError(f"--device-peak-tflops must be a positive number of TFLOP/s per "
                            f"device, not {peak}; remove it to use the peak table or the CPU "
                            f"benchmark.")


# --------------------------------------------------------------------------- start-up


def _train(resolved, device, wrapped, instance, args, kwargs):
    margs = args_read_by(TRAINING)
    if getattr(margs, "throughput_log", True):
        _prepare(resolved, device, margs)
    return wrapped(*args, **kwargs)


def _prepare(resolved: dict, device, margs) -> None:
    from megatron_musa_patch.lib.metrics.peak_flops import (Peak, lookup, measure_matmul,
                                                            training_dtype)

    resolved.clear()
    resolved["args"] = margs
    dtype = training_dtype(margs)
    peak: Optional[Peak] = None
    why = ""
    if getattr(margs, "device_peak_tflops", None):
        peak = Peak(margs.device_peak_tflops, dtype, "--device-peak-tflops")
    elif device.name == CPU.name:
        import torch

        distributed = torch.distributed.is_initialized()
        if distributed:
            torch.distributed.barrier()  # all ranks at once: in training they share the cores
        peak = measure_matmul(dtype)
        if distributed:
            # one peak for every rank (the start-up line and the log line come from different
            # ranks): the mean of their measurements
            world = torch.distributed.get_world_size()
            total = torch.tensor([peak.tflops], dtype=torch.float64)
            torch.distributed.all_reduce(total)
            peak = Peak(float(total.item()) / world, dtype,
                        f"{peak.source} per rank, all {world} ranks at once (mean)")
    else:
        import torch

        name = torch.cuda.get_device_properties(0).name
        peak, why = lookup(name, dtype)
    resolved["peak"], resolved["why"] = peak, why
    if _rank() == 0:
        print(_startup_line(margs, peak, why), flush=True)


def _startup_line(margs, peak, why) -> str:
    batch = margs.global_batch_size
    ours, note = _iteration_flops(margs, batch)
    if not ours:
        return (f"megatron_musa_patch throughput: tokens/s only; the model's FLOPs are not "
                f"counted ({note}), so there is no MFU")
    line = (f"megatron_musa_patch throughput: model FLOPs per iteration (global batch {batch}) "
            f"{significant(ours / 1e12)} TFLOP ({note})")
    upstream = _upstream_flops(margs, batch)
    if upstream:
        diff = (ours - upstream) / upstream * 100
        line += (f"; upstream num_floating_point_operations {significant(upstream / 1e12)} "
                 f"TFLOP ({'+' if diff > 0 else ''}{percent(diff)}: {_differences(margs)})"
                 if abs(diff) > 1e-9 else "; upstream's count is the same")
    if peak is not None:
        line += (f"; device peak {significant(peak.tflops)} TFLOP/s ({peak.dtype}, "
                 f"{peak.source})")
    else:
        line += f"; MFU not shown: {why}; pass --device-peak-tflops"
    return line


def _differences(margs) -> str:
    """Why upstream's count differs for this model (see megatron_musa_patch.lib.metrics.flops)."""
    why = []
    if getattr(margs, "num_experts", None):
        why.append("upstream leaves out the MoE router GEMM")
    if getattr(margs, "multi_latent_attention", False):
        why.append("upstream counts the MLA q/kv RMSNorms as GEMM FLOPs")
    if getattr(margs, "mtp_num_layers", None):
        why.append("upstream counts the MTP RMSNorms as GEMM FLOPs")
    return "; ".join(why) or "see megatron_musa_patch.lib.metrics.flops"


def _iteration_flops(margs, batch):
    from megatron_musa_patch.lib.metrics.flops import UnsupportedModel, iteration_flops

    try:
        return iteration_flops(margs, batch), "counted for this model"
    except UnsupportedModel as exc:
        upstream = _upstream_flops(margs, batch)
        return upstream, f"{exc} not modelled: upstream's count"


def _upstream_flops(margs, batch) -> Optional[float]:
    module = sys.modules.get(TRAINING)
    count = getattr(module, "num_floating_point_operations", None)
    if count is None:
        return None
    try:
        # upstream writes args.num_query_groups when GQA is off: give it a copy
        return float(count(copy.copy(margs), batch))
    except Exception:  # noqa: BLE001 - a comparison only; upstream cannot count every model
        return None


def _rank() -> int:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


# --------------------------------------------------------------------------- the log line


def _print_rank_last(resolved, wrapped, instance, args, kwargs):
    message = call_arguments(wrapped, args, kwargs).get("message")
    if isinstance(message, str) and resolved.get("args") is not None:
        extended = extend_log_line(message, resolved["args"], resolved.get("peak"))
        if extended is not message:
            return wrapped(extended)
    return wrapped(*args, **kwargs)


def throughput_fields(margs, batch: int, seconds_per_iteration: float, peak) -> str:
    flops, _ = _iteration_flops(margs, batch)
    devices = max(1, getattr(margs, "world_size", 1) or 1)
    tokens = batch * margs.seq_length / seconds_per_iteration / devices
    tflops = (flops or 0) / seconds_per_iteration / devices / 1e12
    mfu = percent(100 * tflops / peak.tflops) if peak is not None and flops else "n/a"
    return (f" tokens/s/device: {significant(tokens)} | model TFLOP/s/device: "
            f"{significant(tflops)} | MFU: {mfu} |")


def extend_log_line(message: str, margs, peak) -> str:
    """The iteration line with the throughput fields after the elapsed time; any other message
    is returned as is (the same object)."""
    elapsed, batch = ELAPSED.search(message), BATCH.search(message)
    if elapsed is None or batch is None or float(elapsed.group(1)) <= 0:
        return message
    fields = throughput_fields(margs, int(batch.group(1)), float(elapsed.group(1)) / 1000, peak)
    return message[:elapsed.end()] + fields + message[elapsed.end():]
