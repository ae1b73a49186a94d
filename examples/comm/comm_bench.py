"""Collective bandwidth on this device's backend, printed the way nccl-tests prints it.

    mmp run --nproc-per-node 8 examples/comm/comm_bench.py -b 8 -e 256M -f 2
    torchrun --nproc-per-node 8 --nnodes 2 ... examples/comm/comm_bench.py   # also works

The device and backend come from megatron_musa_patch's device row: MUSA with mccl, CUDA with
nccl, the CPU with gloo (``MEGATRON_MUSA_PATCH_DEVICE`` picks another row). For every message
size and collective (all_reduce, all_gather, reduce_scatter, alltoall, broadcast, sendrecv) it
times ``--iters`` calls after ``--warmup`` and prints, per size: time, algorithm bandwidth
(size / time) and bus bandwidth, the per-link rate that is comparable across world sizes:

    all_reduce      busbw = algbw * 2(n-1)/n
    all_gather      busbw = algbw * (n-1)/n     (size = the gathered output)
    reduce_scatter  busbw = algbw * (n-1)/n     (size = the input)
    alltoall        busbw = algbw * (n-1)/n
    broadcast       busbw = algbw
    sendrecv        busbw = algbw               (each rank sends to the next, receives from
                                                 the previous)

The reported time is the slowest rank's average (all_reduce includes copying the input into the
output buffer, as an out-of-place call; on the CPU row every isend sends a private copy, the
layer's fix for gloo, and sendrecv includes it). After timing, every size is run once more
with known inputs and the result is checked element by element (``#wrong``); any wrong
element makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv")
DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "float16": "float16",
          "bfloat16": "bfloat16", "double": "float64", "int32": "int32"}


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw, as nccl-tests defines it."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def algorithm(backend: str) -> str:
    """What decides the algorithm on this backend (the libraries pick per size)."""
    if backend == "nccl":
        return f"NCCL_ALGO={os.environ['NCCL_ALGO']}" if "NCCL_ALGO" in os.environ else \
            "NCCL's choice per size (set NCCL_ALGO=Ring|Tree|... to pin one)"
    if backend == "mccl":
        return f"MCCL_ALGOS={os.environ['MCCL_ALGOS']}" if "MCCL_ALGOS" in os.environ else \
            "MCCL's choice per size (set MCCL_ALGOS to pin one)"
    if backend == "gloo":
        return "gloo's built-in (ring all_reduce, not configurable from torch)"
    return f"{backend}'s default"


def sizes(min_bytes: int, max_bytes: int, factor: int, element: int, ranks: int) -> List[int]:
    """Message sizes from min to max, each a whole number of elements per rank."""
    unit = element * ranks
    out, size = [], max(min_bytes, 1)
    while size <= max_bytes:
        rounded = max(unit, size // unit * unit)
        if not out or rounded != out[-1]:
            out.append(rounded)
        size *= factor
    return out


def pattern(count: int, offset: int = 0):
    """1..7 repeating: small integers, exact in every dtype after summing over ranks."""
    import torch

    return (torch.arange(offset, offset + count) % 7 + 1).double()


def inputs(op: str, count: int, rank: int, n: int, dtype, device):
    """(input, output) buffers for ``op`` with ``count`` elements of message size."""
    import torch

    per_rank = count // n
    if op == "all_gather":
        src = (rank + 1) * pattern(per_rank)
        return src.to(dtype).to(device), torch.empty(count, dtype=dtype, device=device)
    if op == "reduce_scatter":
        src = (rank + 1) * pattern(count)
        return src.to(dtype).to(device), torch.empty(per_rank, dtype=dtype, device=device)
    if op == "broadcast":
        src = pattern(count) if rank == 0 else torch.zeros(count, dtype=torch.float64)
        return src.to(dtype).to(device), None
    src = (rank + 1) * pattern(count)  # all_reduce, alltoall, sendrecv
    return src.to(dtype).to(device), torch.empty(count, dtype=dtype, device=device)


def expected(op: str, count: int, rank: int, n: int):
    """What ``op`` must leave in this rank's result (float64)."""
    import torch

    per_rank = count // n
    total = n * (n + 1) / 2  # sum of (r + 1) over ranks
    if op == "all_reduce":
        return total * pattern(count)
    if op == "all_gather":
        return torch.cat([(r + 1) * pattern(per_rank) for r in range(n)])
    if op == "reduce_scatter":
        return total * pattern(per_rank, offset=rank * per_rank)
    if op == "alltoall":
        return torch.cat([(q + 1) * pattern(per_rank, offset=rank * per_rank) for q in range(n)])
    if op == "broadcast":
        return pattern(count)
    if op == "sendrecv":
        return ((rank - 1) % n + 1) * pattern(count)
    raise ValueError(op)


def count_wrong(result, want) -> int:
    return int((result.detach().to("cpu").double() != want).sum())


def run_op(op: str, src, dst, rank: int, n: int):
    """One collective call; returns the tensor holding this rank's result."""
    import torch.distributed as dist

    if op == "all_reduce":
        dst.copy_(src)
        dist.all_reduce(dst)
    elif op == "all_gather":
        dist.all_gather_into_tensor(dst, src)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(dst, src)
    elif op == "alltoall":
        dist.all_to_all_single(dst, src)
    elif op == "broadcast":
        dist.broadcast(src, src=0)
        return src
    elif op == "sendrecv":
        ops = [dist.P2POp(dist.isend, src, (rank + 1) % n),
               dist.P2POp(dist.irecv, dst, (rank - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return dst


def parse(argv):
    p = argparse.ArgumentParser(prog="comm_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", type=_bytes, default=_bytes("8"))
    p.add_argument("-e", "--maxbytes", type=_bytes, default=_bytes("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-d", "--datatype", choices=sorted(DTYPES), default="float")
    p.add_argument("-c", "--check", type=int, default=1, help="check results (0: do not)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated from {', '.join(OPS)}")
    p.add_argument("--json", help="rank 0 also writes the results here")
    opts = p.parse_args(argv)
    opts.ops = [o.strip() for o in opts.ops.split(",") if o.strip()]
    unknown = sorted(set(opts.ops) - set(OPS))
    if unknown:
        p.error(f"--ops: unknown {unknown}; choose from {', '.join(OPS)}")
    if opts.stepfactor < 2:
        p.error("--stepfactor must be at least 2")
    return opts


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main(argv=None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    from megatron_musa_patch import activation

    row = activation.activate().device  # the device row: musa/mccl, cuda/nccl or cpu/gloo
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)  # torch.cuda means the row's device
    device = torch.device(row.torch_type) if row.torch_type == "cpu" else \
        torch.device(row.torch_type, local_rank)
    dist.init_process_group(backend=row.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, DTYPES[opts.datatype])
    element = torch.tensor([], dtype=dtype).element_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"# comm_bench: {n} ranks, device {row.name} ({torch.cuda.get_device_properties(0).name}),"
        f" backend {row.backend}, algorithm: {algorithm(row.backend)}")
    say(f"# iters {opts.iters}, warmup {opts.warmup}, check {bool(opts.check)}; time = slowest "
        f"rank's average")
    results: Dict[str, list] = {}
    wrong_total = 0
    for op in opts.ops:
        say(f"#\n# {op} (busbw = algbw x {bus_factor(op, n):.3g})")
        say(f"# {'size':>12} {'count':>12} {'type':>9} {'redop':>6} {'time':>10} {'algbw':>8} "
            f"{'busbw':>8} {'#wrong':>7}")
        say(f"# {'(B)':>12} {'(elements)':>12} {'':>9} {'':>6} {'(us)':>10} {'(GB/s)':>8} "
            f"{'(GB/s)':>8} {'':>7}")
        rows = results.setdefault(op, [])
        for size in sizes(opts.minbytes, opts.maxbytes, opts.stepfactor, element, n):
            count = size // element
            src, dst = inputs(op, count, rank, n, dtype, device)
            for _ in range(opts.warmup):
                run_op(op, src, dst, rank, n)
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(opts.iters):
                run_op(op, src, dst, rank, n)
            torch.cuda.synchronize()
            seconds = torch.tensor([(time.perf_counter() - start) / max(1, opts.iters)],
                                   dtype=torch.float64, device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            wrong = -1
            if opts.check:
                src, dst = inputs(op, count, rank, n, dtype, device)  # fresh buffers
                result = run_op(op, src, dst, rank, n)
                torch.cuda.synchronize()
                bad = torch.tensor([count_wrong(result, expected(op, count, rank, n))],
                                   dtype=torch.float64, device=device)
                dist.all_reduce(bad)
                wrong = int(bad.item())
                wrong_total += wrong
            t = float(seconds.item())
            algbw = size / t / 1e9
            busbw = algbw * bus_factor(op, n)
            redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
            say(f"  {size:>12} {count:>12} {opts.datatype:>9} {redop:>6} {t * 1e6:>10.2f} "
                f"{algbw:>8.3f} {busbw:>8.3f} {wrong if wrong >= 0 else 'N/A':>7}")
            rows.append({"size": size, "count": count, "time_us": t * 1e6, "algbw": algbw,
                         "busbw": busbw, "wrong": wrong})
        avg = sum(r["busbw"] for r in rows) / max(1, len(rows))
        say(f"# {op}: avg bus bandwidth {avg:.3f} GB/s, peak {max(r['busbw'] for r in rows):.3f}"
            f" GB/s")
    say(f"#\n# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}")
    if rank == 0 and opts.json:
        with open(opts.json, "w") as f:
            json.dump({"ranks": n, "device": row.name, "backend": row.backend,
                       "algorithm": algorithm(row.backend), "ops": results,
                       "wrong": wrong_total}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if wrong_total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
