"""Run ``mmp`` as if another torch or megatron-core were installed (``python -m
tests.upstream.probes.release [--torch V] [--megatron-core V] [--add-rows] -- mmp-args``).

``--torch`` sets the imported torch's ``__version__`` (what the layer reads); ``--megatron-core``
answers the installed megatron-core's version; ``--add-rows`` adds their series to the support
tables, as a developer adding a release would. Exits with ``mmp``'s status."""

from __future__ import annotations

import argparse
import sys


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch")
    parser.add_argument("--megatron-core")
    parser.add_argument("--add-rows", action="store_true")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    import torch
    from packaging.version import Version

    from megatron_musa_patch.upstream import installed, tables

    if opts.torch:
        torch.__version__ = opts.torch
        if opts.add_rows:
            series = ".".join(opts.torch.split(".")[:2])
            tables.TORCH = tables.TORCH + (tables.TorchRelease(series, opts.torch),)
    if opts.megatron_core:
        core = Version(opts.megatron_core)
        installed.megatron_core_version = lambda: core
        # a checkout found (or a 0.17+ wheel's own megatron/, which reads as one) goes with it
        installed.megatron_lm_version = lambda path: core if path is not None else None
        if opts.add_rows:
            series = f"{core.major}.{core.minor}"
            tables.MEGATRON = tables.MEGATRON + (tables.MegatronRelease(
                series, f"core_v{core}", str(core), "3.10", "wheel"),)
    from megatron_musa_patch.cli import main as cli

    rest = opts.rest[1:] if opts.rest[:1] == ["--"] else opts.rest
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
