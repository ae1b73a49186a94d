"""CPU-offload optimizer: host-side step throughput, and on an accelerator memory and step time.

CPU part (runs everywhere), side by side in one run:

* the machine's memory bandwidth, measured: an in-place update of a 1 GiB array (read + write,
  the access pattern of an optimizer step; 32x a 32 MiB L3), bytes moved per second. (A
  ``copy_`` into another array also pays a read-for-ownership of the destination: it shows
  about 2/3 of this when its 8 bytes per element are counted.)
* ``torch.optim.AdamW(fused=True)`` stepping N fp32 parameters: parameters/s, and the share of
  the bandwidth bound (a fused AdamW step reads param, grad, exp_avg, exp_avg_sq and writes
  param, exp_avg, exp_avg_sq in place: 28 bytes per parameter);
* megatron-core's ``HybridDeviceOptimizer`` through this layer at F=1.0 (everything stepped on the
  host), with and without ``--overlap-cpu-optimizer-d2h-h2d``: the whole ``step()`` -- gradients
  copied into host buffers, the host AdamW, the parameters copied back -- in parameters/s, against
  its own bound (52 bytes per parameter: each of the two copies adds 12, read + write +
  read-for-ownership);
* ``PrecisionAwareAdamW`` with bf16 moments on the host, for comparison.

On the CPU row the "device" is host memory too, so the copies are host-to-host: this measures the
host optimizer and the copy path the MUSA/CUDA rows use, not PCIe.

Accelerator part (only where ``torch.cuda`` sees a device: CUDA, or MUSA through the layer; it
cannot run on a CPU-only machine and says so): a stack of linear layers sized so that the
optimizer step is under a third of the training step; plain device AdamW(fused) against the
hybrid optimizer at F=0.5 and 1.0, with and without overlap: device memory held by optimizer
state (counted from the optimizer, and the allocator's view) and step-time ratio. Goals: the
device-side state falls in proportion to F; with overlap the F=1.0 step is at most 1.5x.

Usage: python benchmarks/bench_offload.py [--numel 64000000] [--tensors 32] [--repeats 5]
       MEGATRON_MUSA_PATCH_DEVICE=cuda python benchmarks/bench_offload.py --accelerator-only
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import megatron_musa_patch  # noqa: E402,F401 - activates before Megatron is imported

import torch  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.machine import describe  # noqa: E402

from megatron_musa_patch import active_session as current  # noqa: E402
from megatron_musa_patch.lib.offload.counting import placement  # noqa: E402
from megatron_musa_patch.lib.offload.precision_adam import PrecisionAwareAdamW  # noqa: E402

HYPER = dict(lr=1e-4, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-8)
ADAMW_BYTES = 28  # fp32: read p, g, m, v; write p, m, v (in place)
COPY_BYTES = 12  # fp32 out-of-place copy: read source, read-for-ownership + write destination
HYBRID_BYTES = ADAMW_BYTES + 2 * COPY_BYTES  # + gradient copy to the host, parameter copy back
GB = 1e9


def best_seconds(fn, repeats, warmup=2, sync=None):
    """Fastest of ``repeats`` timed calls (like STREAM): on a shared machine the slow calls
    measure the neighbours, and the bandwidth bound is a best-run figure too."""
    times = []
    for i in range(warmup + repeats):
        if sync:
            sync()
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return min(times)


def bandwidth(numel, repeats):
    """Bytes read + written per second by an in-place update of a large array (best run, like
    STREAM), and by a copy into another array counted as 8 bytes per element."""
    data = torch.randn(numel)
    other = torch.empty_like(data)
    in_place = min(best_seconds(lambda: data.mul_(1.0000001), 1, warmup=1)
                   for _ in range(repeats))
    copy = min(best_seconds(lambda: other.copy_(data), 1, warmup=1) for _ in range(repeats))
    moved = 2 * data.numel() * data.element_size()
    return moved / in_place, moved / copy


def params_and_grads(numel, tensors, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    size = numel // tensors
    params = [torch.randn(size, generator=gen).to(device) for _ in range(tensors)]
    grads = [torch.randn(size, generator=gen).mul_(1e-3).to(device) for _ in range(tensors)]
    return params, grads


def bench_adamw(numel, tensors, repeats, **kw):
    params, grads = params_and_grads(numel, tensors)
    for p, g in zip(params, grads):
        p.grad = g
    opt = torch.optim.AdamW(params, **HYPER, **kw)
    return numel / best_seconds(opt.step, repeats)


def bench_precision_aware(numel, tensors, repeats):
    params, grads = params_and_grads(numel, tensors)
    for p, g in zip(params, grads):
        p.grad = g
    opt = PrecisionAwareAdamW(params, **HYPER, fused=True, exp_avg_dtype=torch.bfloat16,
                              exp_avg_sq_dtype=torch.bfloat16)
    return numel / best_seconds(opt.step, repeats)


def hybrid(params, fraction, overlap):
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    return HybridDeviceOptimizer(
        [{"params": params}], offload_fraction=fraction, cpu_optimizer_cls=torch.optim.AdamW,
        gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True,
        overlap_cpu_optimizer_d2h_h2d=overlap, fused=True, **HYPER)


def bench_hybrid_host(numel, tensors, repeats, overlap):
    params, grads = params_and_grads(numel, tensors)
    for p, g in zip(params, grads):
        p.grad = g
    opt = hybrid(params, 1.0, overlap)
    placed = placement(opt)
    assert placed["host_share"] == 1.0 and placed["host_tensors_separate"], placed
    return numel / best_seconds(opt.step, repeats), placed


def cpu_part(args):
    threads = torch.get_num_threads()
    print(f"{describe()}\ntorch threads: {threads}; device row: {current().device.name}; "
          f"{args.numel / 1e6:.1f}M fp32 parameters in {args.tensors} tensors\n")
    bw, copy_bw = bandwidth(args.bandwidth_numel, args.repeats)
    rows = [("memory bandwidth (in-place update, read+write)", f"{bw / GB:.1f} GB/s", "", ""),
            ("  copy_ into another array, 8 B/element", f"{copy_bw / GB:.1f} GB/s", "", "")]
    adamw_bound = bw / ADAMW_BYTES
    hybrid_bound = bw / HYBRID_BYTES
    fused = bench_adamw(args.numel, args.tensors, args.repeats, fused=True)
    rows.append(("torch.optim.AdamW(fused=True)", f"{fused / 1e6:.1f} M params/s",
                 f"{adamw_bound / 1e6:.1f} M (28 B/param)", f"{100 * fused / adamw_bound:.0f}%"))
    single = bench_adamw(args.numel, args.tensors, args.repeats, foreach=False)
    rows.append(("torch.optim.AdamW (single-tensor)", f"{single / 1e6:.1f} M params/s",
                 f"{adamw_bound / 1e6:.1f} M (28 B/param)", f"{100 * single / adamw_bound:.0f}%"))
    for overlap in (False, True):
        rate, placed = bench_hybrid_host(args.numel, args.tensors, args.repeats, overlap)
        label = (f"HybridDeviceOptimizer F=1.0, overlap {'on ' if overlap else 'off'} "
                 f"({placed['host_optimizers']} host opt.)")
        rows.append((label, f"{rate / 1e6:.1f} M params/s",
                     f"{hybrid_bound / 1e6:.1f} M (52 B/param)",
                     f"{100 * rate / hybrid_bound:.0f}%"))
        rows.append(("  vs AdamW(fused=True) alone", f"{rate / fused:.2f}x", "", ""))
    aware = bench_precision_aware(args.numel, args.tensors, args.repeats)
    rows.append(("PrecisionAwareAdamW, bf16 moments (fused)", f"{aware / 1e6:.1f} M params/s",
                 "", ""))
    width = max(len(r[0]) for r in rows)
    print(f"{'host side':<{width}}  {'measured':>16}  {'bandwidth bound':>22}  {'of bound':>8}")
    for name, value, bound, share in rows:
        print(f"{name:<{width}}  {value:>16}  {bound:>22}  {share:>8}")


# ----------------------------------------------------------------------------- accelerator


class Stack(torch.nn.Module):
    def __init__(self, hidden, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


def accelerator_part(args):
    row = current().device
    if args.accelerator_on_cpu and row.torch_type == "cpu":
        print("\naccelerator part ON THE CPU ROW (--accelerator-on-cpu): checks the code path; "
              "memory is the process's resident set and the numbers mean nothing")
    elif row.torch_type == "cpu" or not torch.cuda.is_available():
        print("\naccelerator part: skipped -- no accelerator on this machine (CPU row). Run it "
              "where torch.cuda sees a GPU (MEGATRON_MUSA_PATCH_DEVICE=cuda) or on MUSA.")
        return
    sync = torch.cuda.synchronize
    print(f"\naccelerator: {torch.cuda.get_device_name()} ({row.name} row); hidden "
          f"{args.hidden}, {args.layers} layers, {args.tokens} tokens per step")
    results = {}
    settings = [("no offload", None, False), ("F=0.5", 0.5, False), ("F=0.5 overlap", 0.5, True),
                ("F=1.0", 1.0, False), ("F=1.0 overlap", 1.0, True)]
    for name, fraction, overlap in settings:
        torch.manual_seed(0)
        model = Stack(args.hidden, args.layers).to("cuda")
        x = torch.randn(args.tokens, args.hidden, device="cuda")
        sync()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        params = list(model.parameters())
        if fraction is None:
            opt = torch.optim.AdamW(params, fused=True, **HYPER)
        else:
            opt = hybrid(params, fraction, overlap)

        def step():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

        step()
        sync()
        allocated = torch.cuda.memory_allocated() - before  # gradients + device-side state
        seconds = best_seconds(step, args.repeats, sync=sync)
        opt_only = best_seconds(opt.step, args.repeats, sync=sync)
        placed = placement(opt) if fraction is not None else None
        device_state = (placed["device_state_bytes"] if placed else sum(
            v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
            if torch.is_tensor(v) and k != "step"))
        results[name] = (seconds, opt_only, device_state, allocated, placed)
        del model, opt, params, x
    base_step, base_opt, base_state, _, _ = results["no offload"]
    print(f"baseline: step {1e3 * base_step:.1f} ms, optimizer step {1e3 * base_opt:.1f} ms "
          f"({100 * base_opt / base_step:.0f}% of the step; the goal assumes under 33%)")
    print(f"{'setting':<16} {'step ms':>9} {'vs none':>8} {'optimizer ms':>13} "
          f"{'device state MiB':>17} {'of none':>8} {'allocated MiB':>14} {'host share':>11}")
    for name, (seconds, opt_only, device_state, allocated, placed) in results.items():
        share = "-" if placed is None else f"{placed['host_share']:.2f}"
        print(f"{name:<16} {1e3 * seconds:>9.1f} {seconds / base_step:>7.2f}x "
              f"{1e3 * opt_only:>13.1f} {device_state / 2**20:>17.1f} "
              f"{device_state / base_state:>8.2f} {allocated / 2**20:>14.1f} {share:>11}")
    ratio = results["F=1.0 overlap"][0] / base_step
    print(f"goal: F=1.0 with overlap at most 1.5x the step without offload: {ratio:.2f}x "
          f"({'met' if ratio <= 1.5 else 'not met'})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numel", type=int, default=64_000_000, help="parameters (CPU part)")
    p.add_argument("--tensors", type=int, default=32, help="parameter tensors (CPU part)")
    p.add_argument("--bandwidth-numel", type=int, default=256 * 2 ** 20,
                   help="fp32 elements of the bandwidth array (default 1 GiB)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=4096, help="accelerator part")
    p.add_argument("--layers", type=int, default=8, help="accelerator part")
    p.add_argument("--tokens", type=int, default=16384, help="accelerator part")
    p.add_argument("--accelerator-only", action="store_true")
    p.add_argument("--accelerator-on-cpu", action="store_true",
                   help="run the accelerator part on the CPU row anyway (to check the code "
                        "path with tiny --hidden/--layers/--tokens)")
    args = p.parse_args(argv)
    if not args.accelerator_only:
        cpu_part(args)
    accelerator_part(args)


if __name__ == "__main__":
    main()
