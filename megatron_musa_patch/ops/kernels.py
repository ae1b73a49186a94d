"""The compiled kernels of ``csrc/`` (CUDA and MUSA), built on first use.

The torch-side ops (``ops/norm.py``, ``ops/swiglu.py``, ...) ask ``available(op, device_type)``
and, when it says yes, call ``get(op)``. Nothing here imports torch at module import time,
``available`` and ``status`` never raise, and both are cheap after the first call.

Where the extension comes from, in order:

1. an ahead-of-time build installed with the package (``MMP_BUILD_KERNELS=1 pip install .``):
   the module ``megatron_musa_patch._kernels_cuda`` / ``_kernels_musa``;
2. a just-in-time build of ``csrc/`` with ``torch.utils.cpp_extension.load`` (CUDA, nvcc) or
   ``torch_musa.utils.musa_extension.load`` (MUSA, mcc), cached under
   ``$TORCH_EXTENSIONS_DIR/mmp/`` (torch's default extensions root when unset; the directory
   name carries a hash of the sources, so an edited source is rebuilt, never mixed).

Only for device type ``cuda`` (a CUDA build of torch with a visible GPU, nvcc, ninja) and
``musa`` (torch_musa with a visible device, mcc / MUSA_HOME, ninja). Set
``MEGATRON_MUSA_PATCH_KERNELS=0`` to never load or build them.

Ops (all tensors on the device and contiguous — the wrappers call ``.contiguous()`` —, the last
dimension is the hidden one, dtypes float32 / float16 / bfloat16, math in fp32):

``rms_norm_fwd(x, weight, eps) -> (y, rstd)``
    ``y = x * rstd * weight``, ``rstd = 1 / sqrt(mean(x**2, -1) + eps)``; ``y`` like ``x``,
    ``rstd`` float32 of shape ``x.shape[:-1]``. ``weight`` is ``[hidden]``, dtype of ``x`` or
    float32.
``rms_norm_bwd(dy, x, weight, rstd) -> (dx, dweight)``
    ``dweight`` in ``weight``'s dtype, summed over all rows in fp32.
``layer_norm_fwd(x, weight, bias, eps) -> (y, mean, rstd)``
    ``y = (x - mean) * rstd * weight + bias`` (``bias`` may be None); ``mean``/``rstd`` float32
    of shape ``x.shape[:-1]`` (biased variance, like ``torch.nn.functional.layer_norm``).
``layer_norm_bwd(dy, x, weight, mean, rstd) -> (dx, dweight, dbias)``
``swiglu_fwd(x) -> y``
    ``x = [..., 2f]``, ``y = silu(x[..., :f]) * x[..., f:]`` — megatron-core's convention
    (``fusions/fused_bias_swiglu.swiglu``: ``torch.chunk(y, 2, -1)``, the first half is gated).
``swiglu_bwd(dy, x) -> dx``
    ``dy = [..., f]``, ``dx = [..., 2f]`` (as ``fused_bias_swiglu.swiglu_back``).
``rope_fwd(t, freqs, interleaved) -> out``
    megatron-core's ``_apply_rotary_pos_emb_bshd`` (``mscale = 1``, no MLA reordering):
    ``t = [s, b, h, d]`` (4-D), ``freqs`` 4-D broadcasting over ``t`` in the first three dims
    (megatron passes ``[s, 1, 1, rot_dim]``); ``rot_dim = freqs.shape[-1]`` (even, ``<= d``)
    channels are rotated, the rest pass through. cos/sin are taken in fp32 from the angles
    (freqs are cast to float32).
``rope_bwd(dout, freqs, interleaved) -> dt``
    the gradient of ``rope_fwd`` with respect to ``t``.
``rope_fwd(t, cos, sin, interleaved)`` / ``rope_bwd(dout, cos, sin, interleaved)``
    the same with precomputed tables instead of angles: ``cos``/``sin`` of one shape
    broadcasting like ``freqs`` (any float dtype, e.g. already cast to ``t``'s dtype and scaled
    by mscale, as upstream does). For both forms a 3-D ``t = [tokens, h, d]`` (thd) is taken as
    ``[tokens, 1, h, d]`` with 2-D/3-D ``freqs``/``cos``/``sin`` as ``[tokens, 1, 1, r]``.
``permute(tokens, routing_map, probs=None, num_out_tokens=None) -> (permuted, permuted_probs, sorted_indices)``
    ``megatron.core.transformer.moe.moe_utils.permute`` without ``drop_and_pad``:
    ``tokens = [num_tokens, hidden]``, ``routing_map = [num_tokens, num_experts]`` (bool or
    0/1), ``sorted_indices`` int64, expert-major with token ids ascending;
    ``permuted = tokens[sorted_indices]``; ``permuted_probs`` (probs' dtype) or None.
    ``num_out_tokens``, when given, must equal ``routing_map.sum()``: it saves the host sync
    that finding the output size needs.
``permute(tokens, token_indices) -> tokens[token_indices]``
    with a 1-D int64 index instead of a routing map: the row gather alone.
``unpermute(permuted, sorted_indices, restore_shape, probs=None, routing_map=None) -> out``
    ``moe_utils.unpermute`` without ``drop_and_pad``: ``out = zeros(restore_shape)``,
    ``out[sorted_indices[p]] += permuted[p] * probs_p``, returned in ``permuted``'s dtype.
    ``probs`` is either the permuted probs ``[num_permuted]`` (what ``permute`` returns) or, as
    upstream, ``[num_tokens, num_experts]`` together with ``routing_map``. Each token's rows are
    summed in fp32 in a fixed order (deterministic, no float atomics), then rounded once.
    Indices outside ``[0, num_tokens)`` are ignored.
``unpermute(permuted, token_indices, row_probs, num_tokens) -> out``
    the same, with ``row_probs`` ``[num_permuted]`` or None and ``restore_shape`` given as
    ``num_tokens`` (the hidden size is ``permuted``'s).

The kernels have no autograd; the torch-side ops wrap them in ``torch.autograd.Function``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Dict, Optional

OPS = (
    "rms_norm_fwd", "rms_norm_bwd", "layer_norm_fwd", "layer_norm_bwd",
    "swiglu_fwd", "swiglu_bwd", "rope_fwd", "rope_bwd", "permute", "unpermute",
)
DEVICE_TYPES = ("cuda", "musa")
DISABLE_ENV = "MEGATRON_MUSA_PATCH_KERNELS"

PACKAGE_DIR = Path(__file__).resolve().parents[1]
# source checkout: <repo>/csrc; installed wheel/sdist: megatron_musa_patch/csrc (package data)
_CSRC_CANDIDATES = (PACKAGE_DIR.parent / "csrc", PACKAGE_DIR / "csrc")
KERNEL_SOURCES = ("norm.cu", "swiglu.cu", "rope.cu", "permute.cu")
BINDING_SOURCE = "binding.cpp"
HEADERS = ("include/mmp_device.h", "include/mmp_kernels.h")

_lock = threading.RLock()
# device type -> ("ok", module) | ("unavailable", reason) | ("failed", reason)
_state: Dict[str, tuple] = {}
_wrapped: Dict[tuple, Callable] = {}


def csrc_dir() -> Optional[Path]:
    """The directory holding the kernel sources, or None when they are not shipped."""
    for path in _CSRC_CANDIDATES:
        if (path / BINDING_SOURCE).is_file():
            return path
    return None


def available(op_name: str, device_type: str) -> bool:
    """True when the compiled extension for ``device_type`` is loaded (building it now if needed)
    and has ``op_name``. Never raises; the reason for False is in ``status(device_type)``."""
    try:
        if op_name not in OPS:
            return False
        entry = _ensure(_device_type_name(device_type))
        return entry[0] == "ok" and hasattr(entry[1], op_name)
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return False


def get(op_name: str, device_type: Optional[str] = None) -> Callable:
    """The op ``op_name`` (signatures in the module docstring). ``device_type`` defaults to the
    device type whose extension is loaded (or, when none is, the one this torch can build for).
    Raises KeyError for an unknown op and RuntimeError naming the reason when unavailable."""
    if op_name not in OPS:
        raise KeyError(f"unknown kernel op {op_name!r}; known: {', '.join(OPS)}")
    device_type = _default_device_type() if device_type is None else _device_type_name(device_type)
    entry = _ensure(device_type)
    if entry[0] != "ok":
        raise RuntimeError(f"csrc kernel {op_name!r} is unavailable on {device_type}: {entry[1]}")
    key = (device_type, op_name)
    fn = _wrapped.get(key)
    if fn is None:
        fn = _wrapped[key] = _WRAPPERS[op_name](entry[1])
    return fn


def status(device_type: Optional[str] = None) -> str:
    """One line for ``mmp doctor``: loaded, buildable (not built yet) or why not. Builds nothing."""
    try:
        device_type = _device_type_name(device_type) if device_type else _default_device_type()
        with _lock:
            entry = _state.get(device_type)
        if entry is not None:
            if entry[0] == "ok":
                origin = getattr(entry[1], "__file__", "?")
                return f"{device_type}: loaded ({origin})"
            return f"{device_type}: {'build failed' if entry[0] == 'failed' else 'unavailable'}: {entry[1]}"
        problem = _problem(device_type)
        if problem is not None:
            return f"{device_type}: unavailable: {problem}"
        if _prebuilt_module(device_type) is not None:
            return f"{device_type}: prebuilt extension installed (loaded on first use)"
        return f"{device_type}: not built yet; built on first use into {_build_root()}"
    except Exception as exc:  # noqa: BLE001
        return f"{device_type}: unknown ({type(exc).__name__}: {exc})"


def reset() -> None:
    """Forget loaded/failed states (tests)."""
    with _lock:
        _state.clear()
        _wrapped.clear()
    _torch_musa_importable.cache_clear()


# ---- loading ---------------------------------------------------------------------------------


def _device_type_name(device_type) -> str:
    """'cuda', torch.device('cuda:1') and 'cuda:1' all name the device type 'cuda'."""
    return str(getattr(device_type, "type", device_type)).split(":")[0]


def _ensure(device_type: str) -> tuple:
    with _lock:
        entry = _state.get(device_type)
        if entry is None:
            entry = _load(device_type)
            _state[device_type] = entry
        return entry


def _load(device_type: str) -> tuple:
    problem = _problem(device_type)
    if problem is not None:
        return ("unavailable", problem)
    module = _prebuilt_module(device_type)
    if module is not None:
        return ("ok", module)
    try:
        module = _build(device_type)
    except Exception as exc:  # noqa: BLE001 - reported through status()
        text = str(exc).strip().splitlines()
        tail = " | ".join(line.strip() for line in text[-6:] if line.strip())
        return ("failed", f"{type(exc).__name__}: {tail} (build dir {_build_dir(device_type)})")
    return ("ok", module)


def _default_device_type() -> str:
    with _lock:
        for dt, entry in _state.items():
            if entry[0] == "ok":
                return dt
    if _torch_musa_importable():
        return "musa"
    try:
        import torch

        if torch.version.cuda:
            return "cuda"
    except Exception:  # noqa: BLE001
        pass
    return "cpu"


def _problem(device_type: str) -> Optional[str]:
    """Why the extension cannot be used for ``device_type`` here, or None."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return f"switched off by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    if device_type not in DEVICE_TYPES:
        return (f"device type {device_type!r} has no compiled kernels (only cuda and musa do; "
                f"the ops use their torch implementations there)")
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return f"torch cannot be imported ({exc})"
    if device_type == "cuda":
        if not torch.version.cuda:
            return f"torch {torch.__version__} is not a CUDA build"
        if not _cuda_device_count(torch):
            return "no CUDA device is visible"
    else:
        if not _torch_musa_importable():
            return "torch_musa cannot be imported"
        musa = getattr(torch, "musa", None)
        if musa is None or not musa.is_available():
            return "torch_musa is installed but no MUSA device is visible"
    if _prebuilt_module(device_type) is not None:
        return None
    return _toolchain_problem(device_type)


def _cuda_device_count(torch) -> int:
    # the unpatched query: on other device rows the layer may map torch.cuda.* elsewhere
    count = getattr(torch._C, "_cuda_getDeviceCount", None)
    try:
        return int(count()) if count is not None else int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


@functools.lru_cache(maxsize=None)
def _torch_musa_importable() -> bool:
    try:
        importlib.import_module("torch_musa")
        return True
    except Exception:  # noqa: BLE001
        return False


def _toolchain_problem(device_type: str) -> Optional[str]:
    if csrc_dir() is None:
        return "the csrc/ sources are not installed with this package"
    if shutil.which("ninja") is None:
        try:
            from torch.utils.cpp_extension import is_ninja_available

            if not is_ninja_available():
                return "ninja is not installed (pip install ninja)"
        except Exception:  # noqa: BLE001
            return "ninja is not installed (pip install ninja)"
    if device_type == "cuda":
        from torch.utils.cpp_extension import CUDA_HOME

        nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
        if not nvcc or not os.path.exists(nvcc):
            return "nvcc not found (set CUDA_HOME to the CUDA toolkit)"
        return None
    try:
        ext = importlib.import_module("torch_musa.utils.musa_extension")
    except Exception as exc:  # noqa: BLE001
        return f"torch_musa.utils.musa_extension cannot be imported ({exc})"
    if not hasattr(ext, "load"):
        return "this torch_musa has no musa_extension.load (JIT builds need torch_musa >= 2.x)"
    home = getattr(ext, "MUSA_HOME", None) or os.environ.get("MUSA_HOME") or "/usr/local/musa"
    if not os.path.exists(os.path.join(home, "bin", "mcc")):
        return f"mcc not found under {home} (set MUSA_HOME to the MUSA toolkit)"
    return None


def _prebuilt_module(device_type: str):
    try:
        return importlib.import_module(f"megatron_musa_patch._kernels_{device_type}")
    except Exception:  # noqa: BLE001
        return None


def _source_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for rel in (BINDING_SOURCE, *KERNEL_SOURCES, *HEADERS):
        digest.update(rel.encode())
        digest.update((root / rel).read_bytes())
    return digest.hexdigest()[:10]


def _build_root() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        try:
            from torch.utils.cpp_extension import get_default_build_root

            root = get_default_build_root()
        except Exception:  # noqa: BLE001
            root = os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    return Path(root) / "mmp"


def _extension_name(device_type: str) -> str:
    root = csrc_dir()
    return f"mmp_kernels_{device_type}_{_source_hash(root) if root else 'nosrc'}"


def _build_dir(device_type: str) -> Path:
    try:
        return _build_root() / _extension_name(device_type)
    except Exception:  # noqa: BLE001
        return _build_root()


# Flags shared by the JIT and the setup.py builds. No fast-math: RoPE needs accurate sincosf.
# No -std: torch's and torch_musa's builders add the standard their headers need (the sources
# need C++17 or later).
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr"]
MCC_FLAGS = ["-O3", "-DUSE_MUSA"]


def _build(device_type: str):
    root = csrc_dir()
    name = _extension_name(device_type)
    build_dir = _build_root() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    include = [str(root / "include")]
    verbose = os.environ.get("MMP_KERNELS_VERBOSE", "") == "1"
    if device_type == "cuda":
        from torch.utils.cpp_extension import load

        sources = [str(root / BINDING_SOURCE)] + [str(root / s) for s in KERNEL_SOURCES]
        return load(name=name, sources=sources, extra_include_paths=include, extra_cflags=CXX_FLAGS,
                    extra_cuda_cflags=NVCC_FLAGS, build_directory=str(build_dir), verbose=verbose)
    from torch_musa.utils import musa_extension

    # mcc compiles .mu files: wrap each .cu in a one-line .mu that includes it
    mu_dir = build_dir / "mu"
    mu_dir.mkdir(exist_ok=True)
    sources = [str(root / BINDING_SOURCE)]
    for src in KERNEL_SOURCES:
        wrapper = mu_dir / (Path(src).stem + ".mu")
        wrapper.write_text(f'#include "{root / src}"\n')
        sources.append(str(wrapper))
    return musa_extension.load(name=name, sources=sources, extra_include_paths=include,
                               extra_cflags=CXX_FLAGS + ["-DUSE_MUSA"], extra_musa_cflags=MCC_FLAGS,
                               build_directory=str(build_dir), verbose=verbose)


# ---- Python fronts: argument adaptation only -------------------------------------------------


def _c(t):
    return t.contiguous() if t is not None else None


def _rms_norm_fwd(ext):
    def rms_norm_fwd(x, weight, eps):
        y, rstd = ext.rms_norm_fwd(_c(x), _c(weight), float(eps))
        return y, rstd
    return rms_norm_fwd


def _rms_norm_bwd(ext):
    def rms_norm_bwd(dy, x, weight, rstd):
        dx, dw = ext.rms_norm_bwd(_c(dy), _c(x), _c(weight), _c(rstd))
        return dx, dw
    return rms_norm_bwd


def _layer_norm_fwd(ext):
    def layer_norm_fwd(x, weight, bias, eps):
        y, mean, rstd = ext.layer_norm_fwd(_c(x), _c(weight), _c(bias), float(eps))
        return y, mean, rstd
    return layer_norm_fwd


def _layer_norm_bwd(ext):
    def layer_norm_bwd(dy, x, weight, mean, rstd):
        dx, dw, db = ext.layer_norm_bwd(_c(dy), _c(x), _c(weight), _c(mean), _c(rstd))
        return dx, dw, db
    return layer_norm_bwd


def _swiglu_fwd(ext):
    def swiglu_fwd(x):
        return ext.swiglu_fwd(_c(x))
    return swiglu_fwd


def _swiglu_bwd(ext):
    def swiglu_bwd(dy, x):
        return ext.swiglu_bwd(_c(dy), _c(x))
    return swiglu_bwd


def _rope_view(t, tables):
    # thd [t, h, d] -> [t, 1, h, d]; its freqs / cos / sin [t, 1, r] or [t, r] -> [t, 1, 1, r]
    if t.dim() != 3:
        return t, tables, None
    def as4d(x):
        if x.dim() in (2, 3) and x.numel() == x.shape[0] * x.shape[-1]:
            return x.reshape(x.shape[0], 1, 1, x.shape[-1])
        return x.unsqueeze(1) if x.dim() == 3 else x  # [t, h, r] -> [t, 1, h, r]
    return t.unsqueeze(1), [as4d(x) for x in tables], t.shape


def _rope(ext, backward):
    angles = ext.rope_bwd if backward else ext.rope_fwd
    tabled = ext.rope_bwd_cos_sin if backward else ext.rope_fwd_cos_sin

    def rope(t, *args, interleaved=None):
        # (t, freqs, interleaved) or (t, cos, sin, interleaved); see the module docstring
        args = list(args)
        if interleaved is None:
            interleaved = args.pop() if args and not hasattr(args[-1], "dim") else False
        if len(args) not in (1, 2):
            raise TypeError("rope: expected (t, freqs, interleaved) or (t, cos, sin, interleaved)")
        t4, tables, shape3 = _rope_view(_c(t), args)
        if len(tables) == 1:
            out = angles(t4, tables[0], bool(interleaved))
        else:
            out = tabled(t4, tables[0], tables[1], bool(interleaved))
        return out.view(shape3) if shape3 is not None else out
    rope.__name__ = "rope_bwd" if backward else "rope_fwd"
    return rope


def _rope_fwd(ext):
    return _rope(ext, backward=False)


def _rope_bwd(ext):
    return _rope(ext, backward=True)


def _permute(ext):
    def permute(tokens, routing_map, probs=None, num_out_tokens=None):
        if routing_map.dim() == 1:  # (tokens, token_indices): the row gather alone
            return ext.gather_rows(_c(tokens), _c(routing_map))
        out, permuted_probs, sorted_indices = ext.permute(
            _c(tokens), routing_map, _c(probs), None if num_out_tokens is None else int(num_out_tokens))
        return out, permuted_probs, sorted_indices
    return permute


def _unpermute(ext):
    def unpermute(permuted, sorted_indices, restore_shape=None, probs=None, routing_map=None):
        if restore_shape is None or hasattr(restore_shape, "dim"):
            # (permuted, token_indices, row_probs or None, num_tokens)
            probs, num_tokens = restore_shape, probs
            if num_tokens is None:
                raise TypeError("unpermute(permuted, token_indices, row_probs, num_tokens): "
                                "num_tokens is missing")
            restore_shape = (int(num_tokens), permuted.shape[-1])
        if probs is not None and probs.dim() == 2:
            if routing_map is None:
                raise ValueError("unpermute: 2-D probs [num_tokens, num_experts] need routing_map "
                                 "(or pass the permuted probs [num_permuted] from permute)")
            probs = probs.T.contiguous().masked_select(routing_map.T.contiguous().bool())
        shape = [int(s) for s in restore_shape]
        return ext.unpermute(_c(permuted), _c(sorted_indices), shape, _c(probs))
    return unpermute


_WRAPPERS = {
    "rms_norm_fwd": _rms_norm_fwd, "rms_norm_bwd": _rms_norm_bwd,
    "layer_norm_fwd": _layer_norm_fwd, "layer_norm_bwd": _layer_norm_bwd,
    "swiglu_fwd": _swiglu_fwd, "swiglu_bwd": _swiglu_bwd,
    "rope_fwd": _rope_fwd, "rope_bwd": _rope_bwd,
    "permute": _permute, "unpermute": _unpermute,
}
