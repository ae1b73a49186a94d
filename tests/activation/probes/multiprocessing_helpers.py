"""multiprocessing's helpers under MEGATRON_MUSA_PATCH=1 (the start-up hook's route): a spawn
child that imports nothing activates nothing and has no torch; one that imports torch, or
megatron, is active before its code runs (torch's CUDA calls land on the CPU row). Prints one
line per child.

Run by tests/activation/test_activation.py."""

import multiprocessing as mp
import sys


def bare():
    return f"bare torch={'torch' in sys.modules} layer={'megatron_musa_patch' in sys.modules}"


def layer_active():
    """Whether the layer is active, without importing it (the import would activate it)."""
    layer = sys.modules.get("megatron_musa_patch")
    return layer is not None and layer.is_active()


def with_torch():
    import torch

    return (f"torch active={layer_active()} cuda={torch.cuda.is_available()} "
            f"loader={type(torch.__spec__.loader).__name__}")


def with_megatron():
    import megatron.core  # noqa: F401

    return f"megatron active={layer_active()}"


def run(target, queue):
    queue.put(target())


def main():
    ctx = mp.get_context("spawn")
    queue = ctx.Manager().Queue()  # the Manager server: a spawn child too
    for target in (bare, with_torch, with_megatron):
        child = ctx.Process(target=run, args=(target, queue))
        child.start()
        child.join()
        assert child.exitcode == 0, (target.__name__, child.exitcode)
        print(queue.get())
    print(f"parent torch={'torch' in sys.modules}")


if __name__ == "__main__":
    main()
