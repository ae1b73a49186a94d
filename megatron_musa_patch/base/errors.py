"""Errors the layer raises on purpose.

Each carries one paragraph a user can act on: what is wrong, the culprit (flag, file, patch or
variable) and the fix. ``render()`` is what the command line and the excepthook print instead of a
traceback, after argparse's form ``<program>: error:``: the package's name where the layer refuses
inside a training process, the command (``mmp doctor``, ``mmp data prepare``) where ``mmp`` does.
"""

import textwrap

#: who speaks in an error printed outside a command (a training process, the excepthook)
PROGRAM = "megatron_musa_patch"


class MegatronMusaPatchError(Exception):
    """Base class: a problem the user can fix, reported without a traceback."""

    #: exit status used when this error ends the process
    exit_code = 2

    def render(self, prog: str = PROGRAM) -> str:
        body = " ".join(str(self).split())
        return textwrap.fill(
            f"{prog}: error: {body}", width=100, subsequent_indent="  ",
            break_on_hyphens=False, break_long_words=False,  # keep paths and flags whole
        )


class DeviceSelectionError(MegatronMusaPatchError):
    """MEGATRON_MUSA_PATCH_DEVICE names an unknown device, or one that is not usable here."""


class ActivationOrderError(MegatronMusaPatchError):
    """The layer was activated after Megatron was imported."""


class PatchError(MegatronMusaPatchError):
    """A strict patch could not be applied (target missing, version not verified, ...)."""


class FeatureUnavailableError(MegatronMusaPatchError):
    """A flag asks for a feature whose patches did not apply."""


class ArgumentError(MegatronMusaPatchError):
    """A flag or a combination of flags is invalid."""


class SettingsError(ArgumentError):
    """A ``MEGATRON_MUSA_PATCH_*`` variable holds a value the layer does not know."""


class PluginError(MegatronMusaPatchError):
    """A plugin does not keep the hook contract (an unknown hook name, a bad record)."""


class UnsupportedOnDeviceError(MegatronMusaPatchError, NotImplementedError):
    """Megatron asked the device for something it does not have (e.g. CUDA graphs on CPU)."""


class TorchMappingError(DeviceSelectionError):
    """torchada and the layer disagree about who maps torch (or torchada is needed and missing)."""


def unsupported_stand_in(name: str, message: str, *, as_class: bool = False):
    """What stands in for an accelerator API the device lacks: calling it raises
    :class:`UnsupportedOnDeviceError` with ``message``. Where torch's object is a class
    (``torch.cuda.CUDAGraph``, ``MemPool``, ``graph``) the stand-in is a class too, so the code
    that only names it -- ``torch.cuda.CUDAGraph | None`` in an annotation (transformers),
    ``isinstance`` checks -- works, and only making one raises."""
    def refuse(*args, **kwargs):
        raise UnsupportedOnDeviceError(message)

    if not as_class:
        refuse.__name__ = name
        return refuse

    def __new__(cls, *args, **kwargs):
        refuse()

    return type(name, (), {"__new__": __new__, "__doc__": message})
