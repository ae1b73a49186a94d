"""The release of this package: the one place it is written (setup.py reads this file by path,
``mmp --version`` and ``megatron_musa_patch.__version__`` import it)."""

__version__ = "0.2.0"
