"""Is the installed Megatron one the layer supports, and do its parts belong together?

Run at activation (and again when a Megatron-LM checkout is first found on ``sys.path``). Each
mismatch is one paragraph naming both versions and the fix: a megatron-core outside the support
table; a Python older than the release needs; a checkout of one release beside a megatron-core
of another (its ``pretrain_gpt.py`` or, for 0.16, its ``megatron.training`` would run against
the wrong core); a checkout's ``megatron.training`` shadowing the one a 0.17+ wheel ships.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from . import releases, versions
from .errors import MegatronMusaPatchError

ALLOW = "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1"


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
    core = versions.megatron_core_version()
    lm = versions.megatron_lm_version(lm_path) if lm_path is not None else None
    release = releases.release_of(core)
    if core is not None and release is None:
        if not allow_unverified:
            raise ReleaseMismatchError(
                f"megatron-core {core} is installed, but this layer supports "
                f"{releases.VERIFIED_MEGATRON} ({releases.tags()}). Install a supported release "
                f"(pip install '{releases.INSTALL_REQUIREMENT}'), or set {ALLOW} to try this one: "
                f"each patch is then tried as for the nearest supported release, and `mmp "
                f"patches --json --resolve-all` lists the targets that do not resolve.")
        return (f"megatron-core {core} is not in the support table ({releases.VERIFIED_MEGATRON});"
                f" {ALLOW}: patches are tried as for the nearest supported release; `mmp patches "
                f"--json --resolve-all` lists the targets that do not resolve")
    if release is not None and _older(release.python):
        raise ReleaseMismatchError(
            f"megatron-core {core} needs Python >= {release.python}, and this is Python "
            f"{_python()}. Use Python {release.python} or newer, or install megatron-core "
            f"{releases.oldest().first} (the newest release for older Pythons) with a checkout of "
            f"{releases.oldest().lm_tag}.")
    if lm_path is None or lm is None:
        return None
    lm_release = releases.release_of(lm)
    if lm_release is None and not allow_unverified:
        raise ReleaseMismatchError(
            f"the Megatron-LM checkout at {lm_path} (MEGATRON_LM_PATH, or the first one on "
            f"sys.path) is Megatron-LM {lm}, but this layer supports {releases.tags()}. Check out "
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
    release = releases.release_of(core)
    return release.lm_tag if release is not None else releases.newest().lm_tag


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
    release = releases.release_of(versions.megatron_core_version())
    if release is None or release.training_from != "wheel" or "megatron.training" in sys.modules:
        return
    training, core = _first_on_path("training"), _wheel_root()
    if training is not None and core is not None and training != core:
        raise ReleaseMismatchError(
            f"megatron.training would be imported from {training} instead of megatron-core "
            f"{versions.megatron_core_version()}'s own ({core}): a Megatron-LM checkout is ahead "
            f"of site-packages on sys.path (PYTHONPATH, or the working directory). Remove it from "
            f"there and name it with MEGATRON_LM_PATH instead, which puts it after "
            f"site-packages ({os.environ.get('MEGATRON_LM_PATH') or 'unset now'}).")
