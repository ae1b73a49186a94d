"""megatron-musa-patch: run stock Megatron-LM on Moore Threads GPUs (MUSA), CPU and CUDA."""

import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = "megatron_musa_patch.pth"


class build_py_with_pth(build_py):  # noqa: N801 - setuptools command naming
    """Put the start-up .pth at the root of site-packages (next to the packages).

    It is one line that checks MEGATRON_MUSA_PATCH and imports nothing else when it is unset."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, PTH)
        self.copy_file(os.path.join(HERE, PTH), target, preserve_mode=0)
        # the kernel sources travel inside the package, for first-use builds from a wheel
        if os.path.isdir(os.path.join(HERE, "csrc")):
            self.copy_tree(os.path.join(HERE, "csrc"),
                           os.path.join(self.build_lib, "megatron_musa_patch", "csrc"))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


def _load_by_path(*parts):
    """A module of the package that imports only the standard library, loaded by its path: the
    package itself cannot be imported here (importing it activates the layer)."""
    import importlib.util
    import sys

    name = "_mmp_" + parts[-1][:-3]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, *parts))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def kernel_build():
    """Ahead-of-time build of csrc/ (ext_modules, cmdclass), only with MMP_BUILD_KERNELS=1.

    Default installs stay pure Python and never import torch here. With the variable set, torch
    must be importable in the build environment (pip install --no-build-isolation) and a CUDA
    (nvcc) or MUSA (torch_musa + mcc) toolchain present; otherwise the build is skipped with a
    message and the kernels are built on first use instead (megatron_musa_patch/lib/ops/kernels/)."""
    if os.environ.get("MMP_BUILD_KERNELS", "") != "1":
        return [], {}

    def skip(reason):
        print(f"megatron-musa-patch: MMP_BUILD_KERNELS=1 but not building csrc/: {reason}")
        return [], {}

    try:
        import torch  # noqa: F401
    except ImportError:
        return skip("torch is not importable (use pip install --no-build-isolation)")
    import importlib

    # the file lists and flags live in ops/kernels/sources.py (importing the package activates it)
    flags = _load_by_path("megatron_musa_patch", "lib", "ops", "kernels", "sources.py")
    csrc = os.path.join(HERE, "csrc")
    kernels = [os.path.join("csrc", name) for name in flags.KERNEL_SOURCES]
    binding = os.path.join("csrc", flags.BINDING_SOURCE)
    include = [os.path.join(csrc, "include")]
    try:
        importlib.import_module("torch_musa")
        musa = True
    except ImportError:
        musa = False
    if musa:
        from torch_musa.utils.musa_extension import BuildExtension, MUSAExtension

        # torch_musa's own MUSAExtension on one-line .mu wrappers: the sources are portable, so
        # torchada's CUDAExtension route (which ports sources in place) is not used
        from pathlib import Path

        mu_sources = [os.path.relpath(p, HERE) for p in flags.write_mu_wrappers(
            Path(csrc), Path(HERE) / "build" / "mmp_mu")]
        ext = MUSAExtension("megatron_musa_patch._kernels_musa", [binding] + mu_sources,
                            include_dirs=include,
                            extra_compile_args={"cxx": flags.CXX_FLAGS + ["-DUSE_MUSA"],
                                                "mcc": flags.MCC_FLAGS})
        return [ext], {"build_ext": BuildExtension}
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

    if not torch.version.cuda or CUDA_HOME is None:
        return skip(f"torch {torch.__version__} is not a CUDA build or CUDA_HOME/nvcc is missing")
    ext = CUDAExtension("megatron_musa_patch._kernels_cuda", [binding] + kernels, include_dirs=include,
                        extra_compile_args={"cxx": flags.CXX_FLAGS, "nvcc": flags.NVCC_FLAGS})
    return [ext], {"build_ext": BuildExtension}


EXT_MODULES, EXT_CMDCLASS = kernel_build()
#: the supported Megatron and torch releases (megatron_musa_patch/upstream/tables.py): the
#: requirements admit them all, so installing the layer never moves a supported megatron-core to
#: another release, and never moves torch at all
TABLES = _load_by_path("megatron_musa_patch", "upstream", "tables.py")


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


setup(
    name="megatron-musa-patch",
    version=_load_by_path("megatron_musa_patch", "base", "version.py").__version__,
    description="Patch layer that runs stock Megatron-LM / megatron-core on MUSA, CPU and CUDA",
    long_description=read("README.md"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron_musa_patch", "megatron_musa_patch.*"]),
    py_modules=["_megatron_musa_patch_boot"],
    # the planner's device profiles (mmp plan --device NAME)
    package_data={"megatron_musa_patch.lib.plan": ["profiles/*.json"]},
    install_requires=[
        # no version: pip never replaces an installed torch (on MUSA, the MUSA SDK's build); the
        # activation checks it against the torch table instead
        TABLES.TORCH_REQUIREMENT,
        TABLES.MEGATRON_REQUIREMENT,
        "pluggy>=1.3",
        "wrapt>=1.15",
        "packaging>=23",
        "numpy",
        # megatron-core's checkpoint writer processes need it; without it they die and the
        # save waits forever
        "psutil",
    ],
    extras_require={
        # a torch of the support table, for a new environment (pip install
        # "megatron-musa-patch[torch]"); on MUSA use the MUSA SDK's torch instead
        "torch": [TABLES.TORCH_EXTRA],
        # what megatron.training and pretrain_gpt.py import (Megatron-LM checkout path;
        # pydantic: megatron.training imports megatron.rl, which imports it)
        "training": ["six", "regex", "pyyaml", "einops", "sentencepiece", "tiktoken",
                     "pydantic>=2"],
        # mmp data: tokenizers for training and preparing corpora, progress bars
        # (tested: tokenizers 0.23, transformers 5.24, sentencepiece 0.2.3; tiktoken only for
        # --tokenizer-type TikTokenizer)
        "data": ["tokenizers>=0.20", "transformers>=5", "sentencepiece", "tqdm", "regex",
                 "tiktoken"],
        # mmp checkpoint import-hf | export-hf: safetensors for the weights, transformers for a
        # model directory's tokenizer, tqdm for the progress bar
        "checkpoint": ["safetensors>=0.4", "transformers>=5", "tqdm"],
        # click and requests: upstream's tests/unit_tests/conftest.py imports them, and
        # pytest-mock's `mocker` fixture its pipeline-schedule tests take
        # (tools/conformance runs those tests through the layer); pytest-xdist: the
        # suite's files run on every core (most of a file's time is one process waiting on
        # its ranks, so one file at a time leaves a 2-core machine half idle); setuptools and
        # wheel: the build requirements, for pip's resolver dry run in this environment
        # (tests/project/test_install_requirement.py); simpy: upstream's examples/inference/utils.py
        # imports it (tests/checkpoint/test_hf_generate.py runs upstream's generation script)
        "test": ["pytest>=7", "import-linter>=2.1", "click", "requests", "pytest-mock",
                 "pytest-xdist>=3", "setuptools>=64", "wheel", "simpy",
                 # transformers reads an FP8 checkpoint (the oracle of its import) with it
                 "accelerate"],
        # the rest of upstream's own test dependencies that its tests/unit_tests import
        # (pyproject.toml's `test` group, and of its `training` extra wandb, which
        # megatron/rl/rl_utils.py imports, and omegaconf, which megatron.training.config's
        # YAML round trip needs): for python -m tools.conformance --set all
        "conformance": ["nltk", "pytest-asyncio", "mock", "msgpack", "absl-py", "pyzmq",
                        "tensorboard", "nvtx", "wandb", "omegaconf",
                        "emerging-optimizers; python_version >= '3.12'"],
        # the MUSA row's torch mapping: Moore Threads' torchada, the release the layer's gap
        # records were measured against (device/adapter.py TESTED_VERSION). torch_musa itself
        # comes with the MUSA SDK, not from PyPI.
        "musa": ["torchada==0.1.103"],
    },
    entry_points={
        "console_scripts": ["mmp = _megatron_musa_patch_boot:cli"],
    },
    cmdclass={"build_py": build_py_with_pth, **EXT_CMDCLASS},
    ext_modules=EXT_MODULES,
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
