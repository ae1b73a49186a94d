"""features/startup/lazy_compile.py: a megatron-core module's ``@torch.compile`` compiles at the first
call, so ``import megatron.core`` does not import torch's compiler (from 0.17); the deferral's
contract against a recording compiler."""

import pytest
import torch

from megatron_musa_patch.features.startup.lazy_compile import compile_deferred, lazy
from megatron_musa_patch.upstream import installed
from megatron_musa_patch.upstream.ranges import contains
from tests.conftest import printed_lines, run_probe, subprocess_env

PROBE = "tests.features.probes.lazy_compile_import"


class Recording:
    """A compiler that records its calls and hands back a function that tags its results."""

    def __init__(self):
        self.calls = []

    def __call__(self, model, **options):
        self.calls.append((model, options))
        if isinstance(model, torch.nn.Module):
            return ("module compiled", model)
        return lambda *args, **kwargs: ("compiled", model(*args, **kwargs))


def add(a, b=1):
    """adds"""
    return a + b


def test_a_function_is_compiled_at_its_first_call_once_with_its_options():
    compiler = Recording()
    deferred = lazy(compiler)(add, dynamic=False)
    assert compiler.calls == []  # decorating compiles (and imports) nothing
    assert deferred.__name__ == "add" and deferred.__doc__ == "adds" and deferred.__wrapped__ is add
    assert deferred(2, b=3) == ("compiled", 5)
    assert deferred(4) == ("compiled", 5)
    assert compiler.calls == [(add, {"dynamic": False})]


def test_the_options_form_and_a_module_keep_torch_compiles_behaviour():
    compiler = Recording()
    decorate = lazy(compiler)(mode="max-autotune")
    deferred = decorate(add)
    assert compiler.calls == [] and deferred(1) == ("compiled", 2)
    assert compiler.calls == [(add, {"mode": "max-autotune"})]
    module = torch.nn.Linear(2, 2)
    assert lazy(compiler)(module) == ("module compiled", module)  # at once, as torch.compile


def test_torch_compile_is_restored_after_the_block_even_on_failure():
    real = torch.compile
    with pytest.raises(RuntimeError):
        with compile_deferred(torch):
            assert torch.compile is not real
            raise RuntimeError("the module's source failed")
    assert torch.compile is real


@pytest.mark.skipif(not contains(">=0.17", installed.megatron_core_version()),
                    reason="up to 0.16 no megatron-core module calls torch.compile as it is "
                           "imported (the feature has no record there)")
@pytest.mark.parametrize("disable, expected", [
    # the module the feature served is patched as an imported one is (seen failing: the
    # MoE balancing features' wrappers were missing, their losses zero)
    ("", "dynamo=False lazy=True upstream=True patched=True"),
    # upstream, the feature off: the compiler is imported with megatron.core
    ("startup.lazy_compile", "dynamo=True lazy=False upstream=True patched=True"),
])
def test_import_megatron_core_loads_torchs_compiler_only_without_the_feature(disable, expected):
    proc = run_probe(PROBE, env=subprocess_env(MEGATRON_MUSA_PATCH="1",
                                               MEGATRON_MUSA_PATCH_DISABLE=disable or None))
    assert printed_lines(proc, ["dynamo="]) == [expected], proc.stderr[-3000:]
