"""The ops' process-wide choices, set at activation from the settings.

Like ``torch.backends.*`` flags, these are configuration of the process rather than state of a
run: activation calls :func:`configure` with what ``MEGATRON_MUSA_PATCH_OPS`` / ``_GMM`` /
``_KERNELS`` say, ``deactivate()`` restores the defaults, and a program that uses the ops without
activating the layer gets the defaults (kernels where built, measured choices elsewhere).
Tests use :func:`overridden`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Policy:
    #: eager | compile | native: the implementation forced on every op; None: auto
    forced: Optional[str] = None
    #: loop | grouped_mm: the grouped GEMM forced; None: the measured choice per device
    gmm: Optional[str] = None
    #: False: never load or build the csrc/ kernels
    kernels: bool = True

    @classmethod
    def from_settings(cls, settings) -> "Policy":
        return cls(forced=None if settings.ops == "auto" else settings.ops,
                   gmm=None if settings.gmm == "auto" else settings.gmm,
                   kernels=settings.kernels)


_current = [Policy()]


def current() -> Policy:
    return _current[0]


def configure(policy: Policy) -> None:
    _current[0] = policy


@contextlib.contextmanager
def overridden(**changes):
    """The policy with ``changes`` for the duration of a ``with`` block (tests, benchmarks)."""
    previous = _current[0]
    _current[0] = dataclasses.replace(previous, **changes)
    try:
        yield _current[0]
    finally:
        _current[0] = previous
