"""Flags that work only through a feature, declared by the feature, checked in one place.

A feature lists the Megatron flags that need it in its declaration's ``flag_needs``; the flags its own
``mmp_add_arguments`` adds need it implicitly. When the feature is switched off or its patches
failed, a flag in effect stops the run at argument validation with one paragraph
(:func:`unavailable_error`): the flag, the feature, why the flag needs it here, why the feature is
not there, and what to do instead. The same paragraph serves megatron-core users whose config
asks for the feature.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, FrozenSet, Optional

from megatron_musa_patch.base.errors import FeatureUnavailableError


def _given(dest: str, default: Any = None):
    return lambda args: getattr(args, dest, default) not in (default, None, False)


@dataclasses.dataclass(frozen=True)
class FlagNeed:
    #: the flag as users spell it, e.g. "--use-flash-attn"
    flag: str
    #: True when the flag is in effect *and* needs the feature here (e.g. only without TE);
    #: default: the flag's ``args`` attribute is set (not None/False)
    when: Optional[Callable[[Any], bool]] = None
    #: why the flag needs the feature on this machine, e.g. "upstream's local attention has no
    #: flash path and would ignore the flag"
    because: str = ""
    #: what to do instead of switching the feature back on; default "remove <flag>"
    instead: str = ""
    #: the device rows where the flag needs the feature (None: all; upstream may serve the
    #: flag itself on CUDA)
    devices: Optional[FrozenSet[str]] = None

    def applies(self, args, device: str) -> bool:
        if self.devices is not None and device not in self.devices:
            return False
        test = self.when or _given(self.flag.lstrip("-").replace("-", "_"))
        return bool(test(args))


def unavailable_error(flag: str, feature: str, why_off: str, because: str = "",
                      instead: str = "") -> FeatureUnavailableError:
    """The one paragraph for "this flag needs feature X, which is off or failed"."""
    return unavailable_errors([(flag, feature, why_off, because, instead)])


def unavailable_errors(found) -> FeatureUnavailableError:
    """One paragraph for every flag of ``found`` ((flag, feature, why_off, because, instead)
    each), so a run with several such flags learns all of them at once."""
    needs = "; ".join(f"{flag} needs the feature '{feature}'{f' ({because})' if because else ''}"
                      f", which {why_off}" for flag, feature, why_off, because, _ in found)
    fixes = "; ".join(dict.fromkeys(instead or f"remove {flag}"
                                    for flag, _, _, _, instead in found))
    several = len({feature for _, feature, *_ in found}) > 1
    return FeatureUnavailableError(
        f"{needs}. Switch the feature{'s' if several else ''} back on (see `mmp doctor`), or "
        f"{fixes}.")
