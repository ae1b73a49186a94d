"""benchmarks/bench_kernels.py's cases on the CPU, with torch stand-ins for the csrc kernels: every
case has its eight fields and every timed callable runs. (The benchmark itself needs a GPU; this
keeps its table code from breaking where no GPU checks it.)"""

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from megatron_musa_patch.lib.ops import kernels, norm

ROOT = Path(__file__).resolve().parents[2]


def _layer_norm_fwd(x, w, b, eps):
    mean = x.float().mean(-1)
    rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + eps)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps), mean, rstd


STAND_INS = {"rms_norm_fwd": norm._rms_fwd, "rms_norm_bwd": norm._rms_bwd,
             "layer_norm_fwd": _layer_norm_fwd}


def test_every_case_runs(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_kernels",
                                                  ROOT / "benchmarks" / "bench_kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(kernels, "get", lambda op, dev=None: STAND_INS[op])
    fake = {op: STAND_INS.get(op, lambda *a, **k: None) for op in kernels.OPS}
    names = []
    for case in bench.cases("cpu", torch.float32, scale=64):
        assert len(case) == 8, case[0]
        name, shape, moved, make, eager, to_compile, native, liger = case
        names.append(name)
        assert moved > 0 and shape.startswith("[")
        make(fake)()
        eager()
        for fn in (native, liger):
            if fn is not None:
                fn()
        if to_compile is not None:
            fn, args = to_compile
            fn(*args)
    assert names == ["rms_norm fwd", "rms_norm bwd", "layer_norm fwd", "layer_norm bwd",
                     "swiglu fwd", "swiglu bwd", "rope fwd", "rope bwd", "permute", "unpermute"]
