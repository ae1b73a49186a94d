"""Are the installed Megatron and torch ones the layer supports, and do their parts belong
together?

Run at activation (the Megatron check again when a Megatron-LM checkout is first found on
``sys.path``; the torch_musa check at device selection). Each mismatch is one paragraph naming
both versions and the fix: a megatron-core or a torch outside the tables; a Python older than
the release needs; a checkout of one release beside a megatron-core of another (its
``pretrain_gpt.py`` or, for 0.16, its ``megatron.training`` would run against the wrong core); a
checkout's ``megatron.training`` shadowing the one a 0.17+ wheel ships; a torch_musa built on
another torch than the installed one, or beside a CUDA build of torch (pip replaced the MUSA
SDK's torch).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from megatron_musa_patch.base.env_names import ALLOW_UNVERIFIED_ENV, DEVICE_ENV
from megatron_musa_patch.base.errors import MegatronMusaPatchError
from . import installed, tables
from .ranges import newer_than, release, row_of, text

ALLOW = f"{ALLOW_UNVERIFIED_ENV}=1"


class ReleaseMismatchError(MegatronMusaPatchError):
    """The installed Megatron is not a supported one, or its parts disagree."""


def python_version():
    """This interpreter's (major, minor, micro)."""
    return tuple(sys.version_info[:3])


def _python() -> str:
    return ".".join(str(n) for n in python_version())


def _older(python: str) -> bool:
    return python_version()[:2] < tuple(int(n) for n in python.split("."))


def check(lm_path: Optional[Path], allow_unverified: bool) -> Optional[str]:
    """Raise ReleaseMismatchError for a mismatch; return a warning for an unlisted release that
    ``allow_unverified`` lets through (None when all is well)."""
    core = installed.megatron_core_version()
    lm = installed.megatron_lm_version(lm_path) if lm_path is not None else None
    release = row_of(tables.MEGATRON, core)
    oldest = tables.MEGATRON[0]
    if core is not None and release is None:
        if not allow_unverified:
            raise ReleaseMismatchError(
                f"megatron-core {core} is installed, but this layer supports "
                f"{tables.MEGATRON_SUPPORTED} ({tables.tags()}). Install a supported release "
                f"(pip install '{tables.MEGATRON_REQUIREMENT}'), or set {ALLOW} to try this one: "
                f"each patch is then tried as for the nearest supported release and reported "
                f"unverified, and `mmp patches --resolve-all --strict` lists them.")
        return (f"megatron-core {core} is not in the support table ({tables.MEGATRON_SUPPORTED});"
                f" {ALLOW}: patches are tried as for the nearest supported release and reported "
                f"unverified (`mmp patches --resolve-all --strict` lists them)")
    if release is not None and _older(release.python):
        raise ReleaseMismatchError(
            f"megatron-core {core} needs Python >= {release.python}, and this is Python "
            f"{_python()}. Use Python {release.python} or newer, or install megatron-core "
            f"{oldest.first} (the newest release for older Pythons) with a checkout of "
            f"{oldest.lm_tag}.")
    if lm_path is None or lm is None:
        return None
    lm_release = row_of(tables.MEGATRON, lm)
    if lm_release is None and not allow_unverified:
        raise ReleaseMismatchError(
            f"the Megatron-LM checkout at {lm_path} (MEGATRON_LM_PATH, or the first one on "
            f"sys.path) is Megatron-LM {lm}, but this layer supports {tables.tags()}. Check out "
            f"the tag that matches "
            f"megatron-core {core} (`git -C {lm_path} checkout {_tag_for(core)}`), or set {ALLOW}.")
    if lm_release is not None and _older(lm_release.python):
        raise ReleaseMismatchError(
            f"the Megatron-LM checkout at {lm_path} is {lm} ({lm_release.lm_tag}), which needs "
            f"Python >= {lm_release.python} and megatron-core {lm_release.series}; this is Python "
            f"{_python()} with megatron-core {core}. Check out {_tag_for(core)} there "
            f"(`git -C {lm_path} checkout {_tag_for(core)}`), or use Python {lm_release.python} "
            f"with megatron-core {lm_release.series}.")
    if core is not None and lm_release is not None and release is not None and \
            lm_release.series != release.series:
        raise ReleaseMismatchError(
            f"the Megatron-LM checkout at {lm_path} is {lm} ({lm_release.lm_tag}) but megatron-core "
            f"{core} is installed: its pretrain_gpt.py and megatron.training would run against "
            f"another release's core. Check out {release.lm_tag} there (`git -C {lm_path} "
            f"checkout {release.lm_tag}`), or install megatron-core {lm_release.series} "
            f"(pip install 'megatron-core{lm_release.core}').")
    return None


def _tag_for(core) -> str:
    release = row_of(tables.MEGATRON, core)
    return release.lm_tag if release is not None else tables.MEGATRON[-1].lm_tag


# ----------------------------------------------------------------------------- torch


def check_torch(allow_unverified: bool, version=None) -> Optional[str]:
    """Raise ReleaseMismatchError for a torch outside the table; return a warning when
    ``allow_unverified`` lets it through (None when all is well)."""
    version = installed.torch_version() if version is None else version
    if version is None or row_of(tables.TORCH, version) is not None:
        return None
    where = "newer than" if newer_than(tables.TORCH, version) else "older than"
    musa = tables.TORCH[0]
    if not allow_unverified:
        raise ReleaseMismatchError(
            f"torch {version} is installed, {where} the torch releases this layer supports: "
            f"{tables.TORCH_SUPPORTED} ({tables.torch_series()}; {musa.series} is the torch "
            f"torch_musa {musa.torch_musa} is built on). Install a supported torch (pip install "
            f"'{tables.TORCH_EXTRA}'; on a MUSA machine, the torch of your MUSA SDK), or set "
            f"{ALLOW} to try this one: each patch is then tried as for the nearest supported "
            f"torch and reported unverified, and `mmp patches --resolve-all --strict` lists "
            f"them.")
    return (f"torch {version} is not in the support table ({tables.TORCH_SUPPORTED}); {ALLOW}: "
            f"patches are tried as for the nearest supported torch and reported unverified "
            f"(`mmp patches --resolve-all --strict` lists them)")


def torch_musa_mismatch(torch_version, cuda_build: Optional[str],
                        torch_musa: Optional[str] = None) -> Optional[str]:
    """Why the installed torch_musa cannot serve the installed torch, or None: one paragraph
    with both versions and the fix. torch_musa ``X.Y.Z.postN`` is built on torch ``X.Y.Z``;
    Moore Threads' torch is not a CUDA build, so a CUDA build beside torch_musa is PyPI's,
    installed over the MUSA SDK's by pip. Read from the installed metadata: importing a
    torch_musa built on another torch fails, or crashes the process."""
    torch_musa = installed.torch_musa_version() if torch_musa is None else torch_musa
    built_on, have = release(torch_musa), release(torch_version)
    if torch_musa is None or built_on is None or have is None:
        return None
    needs = text(built_on)
    fix = (f"Reinstall the torch that came with your MUSA SDK (torch {needs}, the wheel beside "
           f"torch_musa's: pip install --force-reinstall --no-deps <that wheel>), and keep pip "
           f"from moving it again: after the reinstall, put the torch line of `pip freeze` in a "
           f"constraints file and point PIP_CONSTRAINT at it. To run on the CPU instead, set "
           f"{DEVICE_ENV}=cpu.")
    if cuda_build:
        return (f"torch {torch_version} is a CUDA build (CUDA {cuda_build}), but torch_musa "
                f"{torch_musa} is installed, which is built on the MUSA SDK's torch {needs}: pip "
                f"has replaced the MUSA torch (PyPI has only CUDA builds), and without MUSA the "
                f"layer would quietly fall back to the CPU. {fix}")
    if built_on != have:
        return (f"torch_musa {torch_musa} is built on torch {needs}, but torch {torch_version} is "
                f"installed: torch_musa cannot load beside it, and without MUSA the layer would "
                f"quietly fall back to the CPU. {fix}")
    return None


def _first_on_path(package: str) -> Optional[Path]:
    """Where ``import megatron.<package>`` would come from by ``sys.path`` order -- found without
    importing anything: importing ``megatron`` now, before the script's directory joins
    ``sys.path``, would fix the namespace before the layer can order it."""
    for entry in sys.path:
        root = Path(entry or os.getcwd())
        if (root / "megatron" / package / "__init__.py").is_file():
            return root.resolve()
    return None


def _wheel_root() -> Optional[Path]:
    """The directory holding the installed megatron-core distribution's ``megatron/``."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(dist.locate_file("")).resolve()


def check_training_source(lm_path: Optional[Path]) -> None:
    """With a megatron-core that ships ``megatron.training`` (0.17+), that is the one imported:
    a checkout earlier on ``sys.path`` must not shadow it."""
    release = row_of(tables.MEGATRON, installed.megatron_core_version())
    if release is None or release.training_from != "wheel" or "megatron.training" in sys.modules:
        return
    training, core = _first_on_path("training"), _wheel_root()
    if training is not None and core is not None and training != core:
        raise ReleaseMismatchError(
            f"megatron.training would be imported from {training} instead of megatron-core "
            f"{installed.megatron_core_version()}'s own ({core}): a Megatron-LM checkout is ahead "
            f"of site-packages on sys.path (PYTHONPATH, or the working directory). Remove it from "
            f"there and name it with MEGATRON_LM_PATH instead, which puts it after "
            f"site-packages ({os.environ.get('MEGATRON_LM_PATH') or 'unset now'}).")
