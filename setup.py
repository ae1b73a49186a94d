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

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


def read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


setup(
    name="megatron-musa-patch",
    version="0.1.0",
    description="Patch layer that runs stock Megatron-LM / megatron-core on MUSA, CPU and CUDA",
    long_description=read("README.md"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron_musa_patch", "megatron_musa_patch.*"]),
    py_modules=["_megatron_musa_patch_boot"],
    install_requires=[
        # torch is pinned by whoever installs it (CI: torch==2.13.0); any release megatron-core
        # 0.16 supports works.
        "torch>=2.6",
        "megatron-core>=0.16.1,<0.17",
        "pluggy>=1.3",
        "wrapt>=1.15",
        "packaging>=23",
        "numpy",
        # megatron-core's checkpoint writer processes need it; without it they die and the
        # save waits forever
        "psutil",
    ],
    extras_require={
        # what megatron.training and pretrain_gpt.py import (Megatron-LM checkout path)
        "training": ["six", "regex", "pyyaml", "einops", "sentencepiece", "tiktoken"],
        # mmp data: tokenizers for training and preparing corpora, progress bars
        # (tested: tokenizers 0.23, transformers 5.24, sentencepiece 0.2.3; tiktoken only for
        # --tokenizer-type TikTokenizer)
        "data": ["tokenizers>=0.20", "transformers>=5", "sentencepiece", "tqdm", "regex",
                 "tiktoken"],
        "test": ["pytest>=7"],
    },
    entry_points={
        "console_scripts": ["mmp = _megatron_musa_patch_boot:cli"],
    },
    cmdclass={"build_py": build_py_with_pth},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
