"""The Megatron releases this layer supports: one table, from which the install requirement
(``setup.py`` reads this file by path), the activation checks, their messages, the tests and
the README's support table derive.

No imports beyond the standard library: ``setup.py`` loads this module before anything is
installed.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple


@dataclasses.dataclass(frozen=True)
class Release:
    #: the megatron-core releases of this row, as a packaging specifier
    core: str
    #: the Megatron-LM tag whose scripts (pretrain_gpt.py ...) go with it
    lm_tag: str
    #: the Python versions upstream supports for it
    python: str
    #: where ``megatron.training`` comes from: "checkout" (MEGATRON_LM_PATH) or "wheel"
    training_from: str

    @property
    def series(self) -> str:
        return self.lm_tag.split("_v", 1)[1].rsplit(".", 1)[0]


RELEASES: Tuple[Release, ...] = (
    Release(core=">=0.16.1,<0.17", lm_tag="core_v0.16.1", python=">=3.10",
            training_from="checkout"),
)

#: the megatron-core versions some row covers (the rows are contiguous)
VERIFIED_MEGATRON = ">=0.16.1,<0.17"
#: what ``pip install megatron-musa-patch`` asks for: the whole table, so installing the layer
#: never moves the user's Megatron to another release
INSTALL_REQUIREMENT = f"megatron-core{VERIFIED_MEGATRON}"


def tags() -> str:
    """The Megatron-LM tags of the table, for messages ("core_v0.16.1")."""
    return ", ".join(r.lm_tag for r in RELEASES)


def newest() -> Release:
    return RELEASES[-1]
