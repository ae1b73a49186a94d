"""The device rows' ``torch.cuda`` takes torch's own shapes, on whatever torch is installed.

torch inspects its own objects beyond calling them: torch 2.14's dynamo reads
``torch.cuda.use_mem_pool.__wrapped__`` when it is first imported, which a plain function does
not have, so ``import torch._dynamo`` (megatron-core reaches it) died on the CPU row. The probe
(tests/device/probes/torch_shapes.py) activates the layer on a row, imports the torch submodules
megatron-core and users reach, compiles a small function, and compares every mapped
``torch.cuda`` name with torch's own: its kind (class, context-manager function, function) and
the calls it accepts. CI runs this on the oldest and the newest torch of the table, so the next
torch release fails here rather than in a user's job.

The CUDA row maps nothing (``torch.cuda`` is torch's own there); no CUDA device is available to
run it here.
"""

import ast
import json
import warnings
from pathlib import Path

import pytest

from megatron_musa_patch.device import shapes, torch_api

from tests.conftest import run_probe, subprocess_env
from tests.device.musa_rows import MAPPINGS, musa_env

pytestmark = pytest.mark.release

def probe(env) -> dict:
    proc = run_probe("tests.device.probes.torch_shapes",
                     env={**env, "MEGATRON_MUSA_PATCH_AUTOACTIVATE": "0"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("SHAPES "))
    return json.loads(line[len("SHAPES "):])


def check(found, device, adapter, compiled=True):
    assert (found["device"], found["adapter"]) == (device, adapter)
    assert {name: status for name, status in found["imports"].items() if status != "ok"} == {}
    assert found["compiled"] == compiled, found["compiled"]
    assert found["differences"] == {}


def test_cpu_row_takes_torchs_shapes():
    check(probe(subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu")), "cpu", "megatron_musa_patch")


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_musa_row_takes_torchs_shapes(mapping):
    """The stand-in torch_musa cannot run kernels, so nothing is compiled on this row here (on
    real MUSA, torch_musa's own dynamo support decides)."""
    adapter = "torchada" if mapping == "torchada" else "megatron_musa_patch"
    found = probe(musa_env(mapping, MEGATRON_MUSA_PATCH_DEVICE="musa", MMP_PROBE_COMPILE="0"))
    check(found, "musa", adapter, compiled="not run")


# ---------------------------------------------------------------------------- the comparison


def test_the_comparison_finds_what_broke_torch_2_14():
    """The stand-in torch 2.14's dynamo could not read, and an Event that took one positional
    argument fewer than torch's: both reported; their shaped versions pass."""
    import contextlib

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        yield

    def plain(*args, **kwargs):
        raise RuntimeError("no pools here")

    assert shapes.differences(use_mem_pool, plain) == [
        "is a function where torch has a context-manager function"]
    shaped = shapes.follow(use_mem_pool, plain)
    assert shapes.differences(use_mem_pool, shaped) == [] and shaped.__wrapped__
    with pytest.raises(RuntimeError, match="no pools here"):
        with shaped(None):
            pass

    class Event:
        def __new__(cls, enable_timing=False, blocking=False, interprocess=False, external=False):
            return object.__new__(cls)

    class ThreeArgs:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False, **kwargs):
            pass

    assert shapes.differences(Event, ThreeArgs) == [
        "does not accept every positional argument as torch's does (too many positional "
        "arguments)"]

    def needs_more(pool, device, extra):
        pass

    assert any("requires" in p or "required arguments" in p
               for p in shapes.differences(use_mem_pool, shapes.follow(use_mem_pool,
                                                                       needs_more)))
    assert shapes.differences(Event, lambda: None) == [
        "is a function where torch has a class"]


def test_the_kinds_known_for_the_torchada_row_are_torchs():
    """Where torchada has taken ``torch.cuda``'s place the layer cannot read torch's objects, so
    it knows their kinds (``torch_api.CUDA_CLASSES``, ``CUDA_CONTEXT_MANAGERS``): each must be
    torch's own, and every class or context-manager function torch has among the mapped names
    must be listed."""
    import torch.cuda.memory

    for name in torch_api.CUDA_API + tuple(torch_api.CUDA_SUBMODULE_API["torch.cuda.memory"]):
        own = getattr(torch.cuda, name, None) or getattr(torch.cuda.memory, name, None)
        if own is None:
            continue
        expected = torch_api.known_kind(name)
        if shapes.kind(own) in (shapes.CLASS, shapes.CONTEXT_MANAGER):
            assert expected == shapes.kind(own), name
        else:
            assert expected == shapes.MISSING, name


# ---------------------------------------------------------------------------- every name reached


def _reached_names(root: Path):
    """``X`` of every ``torch.cuda.X`` in the code under ``root`` (not in docstrings or
    comments): {name: the first file}."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        try:
            with warnings.catch_warnings():  # upstream's invalid escapes are not ours to report
                warnings.simplefilter("ignore", SyntaxWarning)
                tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "cuda" and isinstance(node.value.value, ast.Name) and \
                    node.value.value.id == "torch":
                names.setdefault(node.attr, str(path.relative_to(root.parent)))
    return names


def test_every_torch_cuda_name_megatron_reaches_is_mapped(lm_path_or_none):
    """Each ``torch.cuda.X`` that megatron-core (and the Megatron-LM checkout's
    megatron/training, when given) names is mapped by the device layer or listed as right as it
    is (``torch_api.CUDA_PASS_THROUGH``, each with its reason)."""
    import megatron.core

    roots = [Path(megatron.core.__file__).parent]
    if lm_path_or_none is not None:
        roots.append(lm_path_or_none / "megatron" / "training")
    mapped = set(torch_api.CUDA_API) | set(torch_api.CUDA_PASS_THROUGH) | {
        n for names in torch_api.CUDA_SUBMODULE_API.values() for n in names}
    missing = {}
    for root in roots:
        for name, where in _reached_names(root).items():
            if name not in mapped:
                missing[name] = where
    assert missing == {}


@pytest.fixture
def lm_path_or_none():
    import os

    value = os.environ.get("MEGATRON_LM_PATH")
    return Path(value) if value else None
