"""The shipped start-up hook with multiprocessing's helpers activating at start-up, as every
other process does (what the hook did before they waited for their first torch or megatron
import): bench_helper_activation.py puts this folder first on PYTHONPATH for its baseline.
It loads the installed ``_megatron_musa_patch_boot`` and takes its place."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec(__name__, _path)
_shipped = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shipped)
_shipped.multiprocessing_helper = lambda argv=None: False
sys.modules[__name__] = _shipped
