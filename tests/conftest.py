"""Shared test set-up.

Unit tests import the package without activating it (activation patches torch for the whole
process); tests that need an activated layer start a subprocess, which gets a clean
environment from ``subprocess_env``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"

from megatron_musa_patch.upstream import installed, tables  # noqa: E402 - leaves
from megatron_musa_patch.upstream.ranges import row_of  # noqa: E402
from megatron_musa_patch.core.settings import ENV_NAMES, FOREIGN_ENV_NAMES  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: every variable of the layer (and torchada's, which it reads): a developer's shell must not
#: leak into subprocess tests
_LAYER_ENV = ENV_NAMES + FOREIGN_ENV_NAMES


def subprocess_env(**overrides):
    """The test process's environment without the layer's own variables, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in _LAYER_ENV}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({k: str(v) for k, v in overrides.items() if v is not None})
    return env


def run_python(code, *, env=None, cwd=None, timeout=300, args=()):
    """Run ``python -c code`` (or a file) with a clean layer environment."""
    cmd = [sys.executable, "-c", code, *args] if code is not None else [sys.executable, *args]
    return subprocess.run(cmd, env=env or subprocess_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def probe_env(env=None):
    """``env`` (default: ``subprocess_env()``) with the repository first on ``PYTHONPATH``, as
    a probe module needs it (``run_probe``; a test that starts one with Popen)."""
    env = dict(env or subprocess_env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def run_probe(module, *args, env=None, cwd=None, timeout=300):
    """Run a probe module of the test tree (``tests.device.probes.cpu_groups``) as
    ``python -m module args...``: a real module beside its test, not a string literal. The
    repository is put first on ``PYTHONPATH`` so the probe imports ``tests.*`` helpers and the
    checkout's package wherever ``cwd`` is."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], env=probe_env(env),
                          cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout)


def run_probe_on_one_cpu_rank(module, tmp_path, *args, **env):
    """Run probe ``module`` on the CPU row; it joins a one-rank gloo group through the file store
    its ``sys.argv[1]`` names (in ``tmp_path``), ``args`` follow; ``env`` adds variables (a
    ``MEGATRON_MUSA_PATCH_DISABLE``, say)."""
    return run_probe(module, tmp_path / "store", *args,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu", **env))


def printed_lines(proc, prefixes):
    """The lines a probe printed that start with one of ``prefixes``, once it exited cleanly."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith(tuple(prefixes))]


#: MMP_STOCK_SUITE=ci runs only the stock tests marked `ci` (the CI-sized subset); unset or
#: `all`, every stock test runs when MEGATRON_LM_PATH is set
STOCK_SUITE_ENV = "MMP_STOCK_SUITE"


#: `-n auto`'s most workers: many tests start 2 ranks of about 1.5 GB each, so a worker per core
#: of a large machine would oversubscribe its memory and cores for no gain
MAX_AUTO_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # the user's number, which xdist reads itself
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")  # not on macOS
             else os.cpu_count() or 1)
    return max(1, min(cores, MAX_AUTO_WORKERS))


def pytest_collection_modifyitems(config, items):
    suite = os.environ.get(STOCK_SUITE_ENV, "all").strip().lower() or "all"
    if suite not in ("all", "ci"):
        raise pytest.UsageError(f"{STOCK_SUITE_ENV}={suite!r}: use all or ci")
    if suite == "all":
        return
    skip = pytest.mark.skip(reason=f"outside the CI-sized stock subset ({STOCK_SUITE_ENV}=ci); "
                                   f"unset it to run the whole stock suite")
    for item in items:
        if item.get_closest_marker("stock") and not item.get_closest_marker("ci"):
            item.add_marker(skip)


def release_of_installed_core():
    return row_of(tables.MEGATRON, installed.megatron_core_version())


@pytest.fixture(scope="session")
def lm_path():
    value = os.environ.get("MEGATRON_LM_PATH", "")
    if not value:
        pytest.skip(f"needs a Megatron-LM checkout of a supported tag ({tables.tags()}): set "
                    f"MEGATRON_LM_PATH (archives: ../shared/upstream/)")
    path = Path(value)
    if not (path / "pretrain_gpt.py").is_file():
        pytest.fail(f"MEGATRON_LM_PATH={value} has no pretrain_gpt.py")
    core, lm = release_of_installed_core(), row_of(tables.MEGATRON,
                                                   installed.megatron_lm_version(path))
    if core is None or lm is None or core.series != lm.series:
        pytest.fail(f"MEGATRON_LM_PATH={value} is Megatron-LM "
                    f"{installed.megatron_lm_version(path)} "
                    f"but megatron-core {installed.megatron_core_version()} is installed: point it "
                    f"at the checkout of {core.lm_tag if core else 'a supported tag'}")
    return path


@pytest.fixture(scope="session")
def release():
    """The supported release under test (tables.MegatronRelease of the installed megatron-core)."""
    found = release_of_installed_core()
    if found is None:
        pytest.fail("the installed megatron-core is not in the support table (upstream/tables.py)")
    return found
