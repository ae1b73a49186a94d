"""The layer's settings: every ``MEGATRON_MUSA_PATCH_*`` variable, read and checked once.

:func:`from_env` builds one :class:`Settings` at activation; the session hands it to whatever
needs a value (device selection, toggles, the registry, the ops policy). A value the layer does
not know (a misspelt ``MEGATRON_MUSA_PATCH_OPS=eagr``, a variable ``MEGATRON_MUSA_PATCH_DISABEL``)
is an error naming the variable, what was given and what is accepted -- never silently the
default.

MT-Megatron's own switches (``ENABLE_ZERO_BUBBLE``, ``USE_EPX``, ...; ``MT_VARIABLES``) are read
here too, into ``Settings.mt_env`` (the ones that are set, with their values): the
``mt_megatron.env_switches`` feature honours each where the layer does the same thing and names
the others in one warning, so that a switch set for MT-Megatron is never ignored in silence.

``ENV_NAMES`` lists every variable the layer reads (its own and MT-Megatron's), for test harnesses
that must start subprocesses without a developer's settings leaking in.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Mapping, Optional, Tuple

from megatron_musa_patch.base.errors import SettingsError

# the names, for the modules that import them from here
from megatron_musa_patch.base.env_names import (  # noqa: F401
    ACTIVATE_ENV, ALLOW_LATE_ENV, ALLOW_UNVERIFIED_ENV, ARGS_CHECK_ENV, AUTOACTIVATE_ENV,
    DEVICE_ENV, DISABLE_ENV, LOG_ENV, PREFIX, TORCHADA_ENV, WATCHDOG_DIR_ENV)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    choices: Tuple[str, ...]  # empty: free text (lists, module names, paths)
    default: str
    help: str


VARIABLES = (
    Variable(ACTIVATE_ENV, _TRUE + _FALSE, "0",
             "activate in every Python process of the environment (the .pth start-up hook)"),
    Variable(AUTOACTIVATE_ENV, _TRUE + _FALSE, "1",
             "0: `import megatron_musa_patch` does not activate (mmp's own commands, tests)"),
    Variable(DEVICE_ENV, ("auto", "musa", "cpu", "cuda"), "auto",
             "the device row (auto: musa when torch_musa imports, else cuda when a CUDA GPU is "
             "visible, else cpu)"),
    Variable(DISABLE_ENV, (), "",
             "features switched off, comma-separated; a group name (fused_ops) means all of it"),
    Variable(f"{PREFIX}_ONLY", (), "",
             "keep only these optional features (required ones stay); 'none': required ones "
             "alone"),
    Variable(f"{PREFIX}_PLUGINS", (), "",
             "plugin modules to register by import name (development, tests)"),
    Variable(f"{PREFIX}_BLOCK_PLUGINS", (), "",
             "installed external plugins not to load, by name"),
    Variable(ALLOW_LATE_ENV, _TRUE + _FALSE, "0",
             "1: activate even after Megatron was imported (copies are rebound where found)"),
    Variable(ALLOW_UNVERIFIED_ENV, _TRUE + _FALSE, "0",
             "1: apply patches on a Megatron release they were not verified on"),
    Variable(f"{PREFIX}_JIT", ("auto", "compile", "eager"), "auto",
             "what megatron.core.jit.jit_fuser does (auto: the device row's default)"),
    Variable(f"{PREFIX}_OPS", ("auto", "eager", "compile", "native"), "auto",
             "force one implementation of every op in megatron_musa_patch.lib.ops (comparisons)"),
    Variable(f"{PREFIX}_GMM", ("auto", "loop", "grouped_mm"), "auto",
             "grouped GEMM for --moe-grouped-gemm (auto: measured choice per device)"),
    Variable(f"{PREFIX}_KERNELS", _TRUE + _FALSE, "1",
             "0: never load or build the csrc/ kernels"),
    Variable(TORCHADA_ENV, _TRUE + _FALSE, "1",
             "on the musa row, torch-level mapping by torchada (the musa extra); 0: the layer's "
             "built-in mapping"),
    Variable(LOG_ENV, ("brief", "full"), "brief",
             "what a rank prints about the layer: brief (one line; the patch table only when a "
             "patch failed; upstream's warnings that TransformerEngine or Apex is missing as one "
             "line saying what runs instead), full (the patch table and upstream's warnings as "
             "they are)"),
    Variable(ARGS_CHECK_ENV, _TRUE + _FALSE, "1",
             "`mmp run` checks a Megatron script's arguments with Megatron's own parser before "
             "any rank starts (0: the ranks check them, each on its own)"),
    Variable(WATCHDOG_DIR_ENV, (), "",
             "where each rank's hang watchdog writes its report (`mmp run` sets it and reads "
             "them; unset: the stack goes to the rank's stderr)"),
)

#: MT-Megatron's environment switches (its musa_patch reads them at import), for
#: ``Settings.mt_env``; what each one means here is decided by features/mt_megatron/env_switches.py
MT_VARIABLES = (
    "ENABLE_ZERO_BUBBLE", "USE_EPX", "USE_RECOMPUTE_VARIANCE", "USE_DEEPEP_ACE", "USE_CE_ALLTOALL",
    "USE_MUSA_MOE", "USE_MUSA_ROUTER", "ENABLE_PROFILER", "ENABLE_ASYNC_CKPT", "NO_LOSS_REDUCE",
    "CPU_OPTIMIZER_PRECISION_AWARE_RECONFIG", "ENABLE_D2H_IN_PERMUTATION", "MLFLOW_TRACKING_URI",
    "ACCELERATOR_BACKEND",
)

ENV_NAMES = tuple(v.name for v in VARIABLES) + MT_VARIABLES
_BY_NAME = {v.name: v for v in VARIABLES}
#: read by the layer but not its own (Megatron-LM's convention)
LM_PATH_ENV = "MEGATRON_LM_PATH"
#: torchada's own switches, read (never checked against our names) because the musa row's
#: mapping depends on them: the platform torchada maps for, and whether it lets
#: torch.cuda.is_available() report MUSA (Megatron asserts it)
TORCHADA_PLATFORM_ENV = "TORCHADA_PLATFORM"
TORCHADA_FORCE_ENV = "TORCHADA_FORCE_CUDA_AVAILABLE"
#: other projects' variables the settings read (test harnesses strip these too)
FOREIGN_ENV_NAMES = (TORCHADA_PLATFORM_ENV, TORCHADA_FORCE_ENV)


#: what turns an MT-Megatron switch off (an empty value too)
OFF = ("", "0", "false", "no", "off")


def switched_on(value: str) -> bool:
    return value.strip().lower() not in OFF


def _list(text: str) -> Tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the variables say, parsed. Build with :func:`from_env` (or directly, in tests)."""

    device: str = "auto"
    disable: Tuple[str, ...] = ()
    only: Optional[Tuple[str, ...]] = None  # None: not set; () : 'none'
    plugins: Tuple[str, ...] = ()
    block_plugins: Tuple[str, ...] = ()
    allow_late: bool = False
    allow_unverified: bool = False
    jit: str = "auto"
    ops: str = "auto"
    gmm: str = "auto"
    kernels: bool = True
    #: musa row: torchada maps torch (True) or the layer's built-in mapping does (False)
    torchada: bool = True
    #: TORCHADA_PLATFORM, lower-cased (None: unset; torchada then detects the platform)
    torchada_platform: Optional[str] = None
    #: TORCHADA_FORCE_CUDA_AVAILABLE as given (None: unset, the layer sets it to 1 on musa)
    torchada_force_cuda_available: Optional[str] = None
    lm_path: Optional[Path] = None
    #: the MT-Megatron switches (MT_VARIABLES) that are set: ((name, value), ...)
    mt_env: Tuple[Tuple[str, str], ...] = ()
    #: MEGATRON_MUSA_PATCH_WATCHDOG_DIR (None: unset)
    watchdog_dir: Optional[str] = None
    #: MEGATRON_MUSA_PATCH_LOG: "brief" or "full"
    log: str = "brief"
    #: MEGATRON_MUSA_PATCH_ARGS_CHECK
    args_check: bool = True

    def mt_switch_on(self, name: str) -> bool:
        """Whether the MT-Megatron switch ``name`` is set to something other than off."""
        return switched_on(dict(self.mt_env).get(name, ""))

    def changed(self) -> dict:
        """The variables whose value differs from the default (``mmp doctor``)."""
        defaults = Settings().as_env()
        return {k: v for k, v in self.as_env().items() if defaults.get(k) != v}

    def as_env(self) -> dict:
        """The variables that reproduce these settings (for processes this one starts)."""
        env = {f"{PREFIX}_DEVICE": self.device, f"{PREFIX}_JIT": self.jit,
               f"{PREFIX}_OPS": self.ops, f"{PREFIX}_GMM": self.gmm,
               f"{PREFIX}_KERNELS": "1" if self.kernels else "0",
               f"{PREFIX}_TORCHADA": "1" if self.torchada else "0",
               f"{PREFIX}_ALLOW_LATE": "1" if self.allow_late else "0",
               f"{PREFIX}_ALLOW_UNVERIFIED": "1" if self.allow_unverified else "0",
               f"{PREFIX}_LOG": self.log, f"{PREFIX}_ARGS_CHECK": "1" if self.args_check else "0"}
        for name, values in ((f"{PREFIX}_DISABLE", self.disable),
                             (f"{PREFIX}_PLUGINS", self.plugins),
                             (f"{PREFIX}_BLOCK_PLUGINS", self.block_plugins)):
            if values:
                env[name] = ",".join(values)
        if self.only is not None:
            env[f"{PREFIX}_ONLY"] = ",".join(self.only) or "none"
        return env


def _value(environ: Mapping[str, str], name: str) -> str:
    variable = _BY_NAME[name]
    text = environ.get(name, "").strip()
    if not text:
        return variable.default
    low = text.lower()
    if variable.choices and low not in variable.choices:
        raise SettingsError(
            f"{name}={text!r} is not a value this layer knows: use one of "
            f"{', '.join(_shown_choices(variable))} ({variable.help}).")
    return low if variable.choices else text


def _shown_choices(variable: Variable):
    if variable.choices[:len(_TRUE + _FALSE)] == _TRUE + _FALSE:
        return ("1", "0")
    return variable.choices


def _flag(environ, name) -> bool:
    return _value(environ, name) in _TRUE


def autoactivate(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``import megatron_musa_patch`` activates (``MEGATRON_MUSA_PATCH_AUTOACTIVATE``,
    every spelling the other switches take); the only reader of the variable."""
    return _flag(os.environ if environ is None else environ, AUTOACTIVATE_ENV)


def _check_names(environ: Mapping[str, str]) -> None:
    for name in environ:
        if name.startswith(PREFIX) and name not in _BY_NAME:
            own = tuple(v.name for v in VARIABLES)
            close = difflib.get_close_matches(name, own, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise SettingsError(
                f"{name} is not a variable of this layer ({hint}known: "
                f"{', '.join(own)}); unset it or fix its name.")


def from_env(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """Read and check every variable (``os.environ`` by default)."""
    environ = os.environ if environ is None else environ
    _check_names(environ)
    only_text = environ.get(f"{PREFIX}_ONLY", "").strip()
    only = None
    if only_text:
        names = _list(only_text)
        only = tuple(n for n in names if n != "none")
    lm = environ.get(LM_PATH_ENV, "").strip()
    return Settings(
        device=_value(environ, DEVICE_ENV),
        disable=_list(environ.get(DISABLE_ENV, "")),
        only=only,
        plugins=_list(environ.get(f"{PREFIX}_PLUGINS", "")),
        block_plugins=_list(environ.get(f"{PREFIX}_BLOCK_PLUGINS", "")),
        allow_late=_flag(environ, ALLOW_LATE_ENV),
        allow_unverified=_flag(environ, ALLOW_UNVERIFIED_ENV),
        jit=_value(environ, f"{PREFIX}_JIT"),
        ops=_value(environ, f"{PREFIX}_OPS"),
        gmm=_value(environ, f"{PREFIX}_GMM"),
        kernels=_flag(environ, f"{PREFIX}_KERNELS"),
        torchada=_flag(environ, TORCHADA_ENV),
        torchada_platform=environ.get(TORCHADA_PLATFORM_ENV, "").strip().lower() or None,
        torchada_force_cuda_available=environ.get(TORCHADA_FORCE_ENV),
        lm_path=Path(lm).expanduser().resolve() if lm else None,
        mt_env=tuple((name, environ[name].strip()) for name in MT_VARIABLES
                     if environ.get(name, "").strip()),
        watchdog_dir=environ.get(WATCHDOG_DIR_ENV, "").strip() or None,
        log=_value(environ, LOG_ENV),
        args_check=_flag(environ, ARGS_CHECK_ENV),
    )
