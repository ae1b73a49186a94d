"""``import megatron.core`` with the layer active (``MEGATRON_MUSA_PATCH=1`` from the test), then
one line: ``dynamo=<torch._dynamo imported> lazy=<the router's compiled routing is the
feature's deferral> upstream=<what it wraps is router.py's function> patched=<the layer's
patches of the module's classes applied (moe_device_balance wraps TopKRouter.routing)>``.

Run by tests/features/startup/test_lazy_compile.py."""

import sys

import wrapt

import megatron.core  # noqa: F401 - the import under test
from megatron.core.transformer.moe import router


def main():
    routing = router.InferenceTopKRouter._compiled_topk_routing
    deferral = routing.__code__.co_filename.endswith("lazy_compile.py")
    inner = getattr(routing, "__wrapped__", None)  # torch.compile's wrapper has it too
    code = getattr(inner, "__code__", None)
    print(f"dynamo={'torch._dynamo' in sys.modules} lazy={deferral} "
          f"upstream={code is not None and code.co_filename == router.__file__} "
          f"patched={isinstance(vars(router.TopKRouter)['routing'], wrapt.FunctionWrapper)}")


if __name__ == "__main__":
    main()
