"""What the layer costs at start-up and per call, measured side by side in one run.

1. Import time, each in a fresh interpreter (median of --repeat runs):
   `import megatron.core` alone vs `import megatron_musa_patch; import megatron.core`
   (activation, device selection, every patch applied as Megatron's modules load).
2. Per-call cost of the device-string translation the CPU/MUSA rows add to hot torch calls
   (`torch.empty(device=...)`, `Tensor.to(dtype)`), patched vs torch's own function.

Usage: python benchmarks/bench_activation.py [--repeat 7]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/
from tools.machine import describe  # noqa: E402

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}


def timed_import(code: str, env: dict) -> float:
    probe = f"import time, torch; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def import_times(repeat: int):
    base, layered = [], []
    # torch is imported first in both, so the comparison is about Megatron and the layer
    for _ in range(repeat):  # interleaved, so drift affects both alike
        base.append(timed_import("import megatron.core", CLEAN))
        layered.append(timed_import(
            "import megatron_musa_patch; import megatron.core",
            dict(CLEAN, MEGATRON_MUSA_PATCH_DEVICE="cpu")))
    return statistics.median(base), statistics.median(layered)


def per_call():
    os.environ["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"
    import torch

    import megatron_musa_patch

    x = torch.ones(16)
    original_empty, original_to = torch.empty, torch.Tensor.to
    n = 200_000
    rows = []
    base_empty = min(timeit.repeat(lambda: original_empty(16, device="cpu"), number=n, repeat=5))
    base_to = min(timeit.repeat(lambda: original_to(x, torch.float64), number=n, repeat=5))
    os.environ["MEGATRON_MUSA_PATCH_DEVICE"] = "cpu"
    megatron_musa_patch.activate(allow_late=True)
    try:
        layer_empty = min(timeit.repeat(lambda: torch.empty(16, device="cuda"), number=n,
                                        repeat=5))
        layer_to = min(timeit.repeat(lambda: x.to(torch.float64), number=n, repeat=5))
    finally:
        megatron_musa_patch.deactivate()
    rows.append(("torch.empty(16, device=...)", base_empty / n, layer_empty / n))
    rows.append(("Tensor.to(torch.float64)", base_to / n, layer_to / n))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    opts = parser.parse_args()
    print(describe())
    base, layered = import_times(opts.repeat)
    print(f"\nimport time (median of {opts.repeat} fresh interpreters, after `import torch`):")
    print(f"  import megatron.core                          {base * 1000:8.1f} ms")
    print(f"  import megatron_musa_patch; megatron.core     {layered * 1000:8.1f} ms")
    print(f"  ratio layer / alone                           {layered / base:8.3f}  "
          f"({(layered - base) * 1000:+.1f} ms)")
    print("  (upstream's @jit_fuser is torch.compile, which imports torch._dynamo while Megatron "
          "loads;\n   the CPU row's eager @jit_fuser skips that)")
    print("\nper call (best of 5 x 200k calls):")
    for name, base_s, layer_s in per_call():
        print(f"  {name:30} torch {base_s * 1e9:7.0f} ns   layer {layer_s * 1e9:7.0f} ns   "
              f"ratio {layer_s / base_s:5.2f}  ({(layer_s - base_s) * 1e9:+.0f} ns)")


if __name__ == "__main__":
    main()
