"""The releases this layer supports: one table for Megatron, one for torch.

Everything else derives from them: the install requirement and the CI constraints (``setup.py``
reads this file by path; ``scripts/constraints.txt`` is checked against it), the activation
checks and their messages, the tests, the compatibility matrix (``tools/compat_matrix.py``) and
the README's support tables. Supporting a new release is one row here; verifying it is running
the compatibility matrix on it (its cells in ``docs/compatibility/results.json``, which
``tests/upstream/test_verified.py`` requires) and moving ``MEGATRON_VERIFIED`` /
``TORCH_VERIFIED`` below. The records take those ranges unless they say otherwise.

Standard library only: ``setup.py`` loads this module before anything is installed. Versions
are compared in ``ranges.py``, not here.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple


@dataclasses.dataclass(frozen=True)
class MegatronRelease:
    #: the release series, "0.19"
    series: str
    #: the Megatron-LM tag whose scripts (pretrain_gpt.py ...) go with it, and that CI runs
    lm_tag: str
    #: the oldest megatron-core release of the series the layer supports
    first: str
    #: the lowest Python upstream supports for it
    python: str
    #: where ``megatron.training`` comes from: "checkout" (MEGATRON_LM_PATH) or "wheel"
    training_from: str

    @property
    def core(self) -> str:
        """The megatron-core versions of this row, as a range."""
        return f">={self.first},<{next_series(self.series)}"


@dataclasses.dataclass(frozen=True)
class TorchRelease:
    #: the release series, "2.11"
    series: str
    #: the oldest torch release of the series the layer supports
    first: str
    #: the torch_musa release built on this torch (Moore Threads' MUSA SDK), if there is one
    torch_musa: str = ""

    @property
    def range(self) -> str:
        return f">={self.first},<{next_series(self.series)}"


MEGATRON: Tuple[MegatronRelease, ...] = (
    MegatronRelease("0.16", "core_v0.16.1", "0.16.1", "3.10", "checkout"),
    MegatronRelease("0.17", "core_v0.17.1", "0.17.0", "3.12", "wheel"),
    MegatronRelease("0.18", "core_v0.18.2", "0.18.0", "3.12", "wheel"),
    MegatronRelease("0.19", "core_v0.19.0", "0.19.0", "3.12", "wheel"),
)

#: oldest: the torch the newest torch_musa is built on; newest: the newest torch on PyPI
TORCH: Tuple[TorchRelease, ...] = (
    TorchRelease("2.11", "2.11.0", torch_musa="2.11.0.post2"),
    TorchRelease("2.12", "2.12.0"),
    TorchRelease("2.13", "2.13.0"),
    TorchRelease("2.14", "2.14.0"),
    TorchRelease("2.15", "2.15.0"),
)


def next_series(series: str) -> str:
    major, minor = (int(p) for p in series.split(".")[:2])
    return f"{major}.{minor + 1}"


def span(table) -> str:
    """The range a table's rows cover together (the rows are contiguous)."""
    return f">={table[0].first},<{next_series(table[-1].series)}"


#: the megatron-core releases some row covers
MEGATRON_SUPPORTED = span(MEGATRON)
#: the torch releases some row covers
TORCH_SUPPORTED = span(TORCH)

#: the megatron-core releases the layer's records were verified on as a whole: a record that names
#: no range, or only its lower bound, was verified on these (``core/records.py``). Move the bound
#: only with the compatibility matrix's passing cells of the new series as the evidence.
MEGATRON_VERIFIED = ">=0.16.1,<0.20"
#: the torch releases likewise, for the records that name a torch range
TORCH_VERIFIED = ">=2.11,<2.16"

#: what ``pip install megatron-musa-patch`` asks for: the whole table, so installing the layer
#: never moves a supported megatron-core to another release
MEGATRON_REQUIREMENT = f"megatron-core{MEGATRON_SUPPORTED}"
#: torch is required with no version: installing the layer never moves the user's torch (on a
#: MUSA machine it is the MUSA SDK's build, which pip must not replace; a torch outside the
#: table is refused at activation instead, with the fix)
TORCH_REQUIREMENT = "torch"
#: the ``torch`` extra, for a new environment: a torch of the table
TORCH_EXTRA = f"torch{TORCH_SUPPORTED}"


def tags() -> str:
    """The Megatron-LM tags of the table, for messages ("core_v0.16.1, ..., core_v0.19.0")."""
    return ", ".join(r.lm_tag for r in MEGATRON)


def torch_series() -> str:
    """The torch series of the table, for messages ("2.11 to 2.15")."""
    return f"{TORCH[0].series} to {TORCH[-1].series}"


def markdown_tables() -> str:
    """The support tables of the README and docs/installation.md (tests/upstream/test_check.py
    checks both)."""
    rows = ["| megatron-core | Megatron-LM tag | Python | `megatron.training` from |",
            "|---|---|---|---|"]
    for r in MEGATRON:
        source = ("the checkout (`MEGATRON_LM_PATH`)" if r.training_from == "checkout"
                  else "the megatron-core wheel (scripts from the checkout)")
        rows.append(f"| `{r.core}` | `{r.lm_tag}` | >= {r.python} | {source} |")
    rows += ["", "| torch | torch_musa built on it |", "|---|---|"]
    for t in TORCH:
        rows.append(f"| `{t.range}` | {t.torch_musa or '-'} |")
    return "\n".join(rows)
