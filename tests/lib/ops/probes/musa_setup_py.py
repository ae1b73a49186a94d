"""setup.py's MUSA extension, run in the current directory (a copy of the checkout) with
``setuptools.setup`` stubbed out: prints ``RESULT{json}`` with the extension's name, sources,
keyword arguments and the module of its ``build_ext``.

Run by tests/lib/ops/test_kernels_musa_build.py."""

import json
import runpy

import setuptools


def main():
    setuptools.setup = lambda **kwargs: None  # only the extension configuration is wanted
    setup = runpy.run_path("setup.py")
    ext, = setup["EXT_MODULES"]
    print("RESULT" + json.dumps({"name": ext.name, "sources": ext.sources, "kwargs": ext.kwargs,
                                 "build_ext": setup["EXT_CMDCLASS"]["build_ext"].__module__}))


if __name__ == "__main__":
    main()
