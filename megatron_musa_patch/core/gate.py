"""Whether a record applies here: its device rows, its feature's switch, its condition, and the
megatron-core and torch releases it was verified on against those installed."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

from .records import Patch
from .results import APPLIED, FAILED, SKIPPED, UNVERIFIED
from .toggles import Toggles
from megatron_musa_patch.upstream import installed, ranges, tables
from megatron_musa_patch.upstream.ranges import Range


class Gate:
    def __init__(self, device: str, toggles: Toggles, version_of: Callable[[str], Any],
                 torch_version: Any, allow_unverified: bool):
        self.device = device
        self.toggles = toggles
        #: module name -> the installed Megatron version its patches are gated on
        self.version_of = version_of
        #: the installed torch, which torch ranges are gated on
        self.torch_version = torch_version
        self.allow_unverified = allow_unverified

    def off_reason(self, patch: Patch) -> Optional[str]:
        """Why the record is not for this run (its device rows, its feature's switch), or None."""
        if not patch.for_device(self.device):
            return f"not needed on {self.device} (applies on {', '.join(sorted(patch.devices))})"
        if self.toggles.is_off(patch.feature):
            return f"feature '{patch.feature}' {self.toggles.why(patch.feature)}"
        return None

    @staticmethod
    def condition_reason(patch: Patch) -> Optional[str]:
        """Why the record's condition says not to apply it, or None (no condition, or True)."""
        if patch.condition is None:
            return None
        verdict = patch.condition()
        if verdict is True:
            return None
        return verdict if isinstance(verdict, str) else "condition false"

    def verdict(self, patch: Patch, variants: Sequence[Patch] = ()) -> Tuple[str, str]:
        """Whether ``patch`` is meant for the installed releases, whatever the device and
        toggles: (APPLIED, "") where both its ranges hold, (UNVERIFIED, why) where it is tried
        on a release it was not verified on, (SKIPPED, why) where it is not for this release,
        (FAILED, why) on a release outside a table unless ALLOW_UNVERIFIED. ``variants``: the
        other records of ``patch.id`` (a newer one takes over after this one's range)."""
        verdicts = [self._range_verdict(patch, variants, "megatron", patch.megatron,
                                        self.version_of(patch.module),
                                        installed.gating_distribution(patch.module),
                                        tables.MEGATRON)]
        if patch.torch is not None:
            verdicts.append(self._range_verdict(patch, variants, "torch", patch.torch, self.torch_version,
                                                "torch", tables.TORCH))
        if patch.distribution:
            verdicts.append(self._distribution_verdict(patch))
        for status in (FAILED, SKIPPED, UNVERIFIED):
            reasons = [why for verdict, why in verdicts if verdict == status]
            if reasons:
                return status, "; ".join(reasons)
        return APPLIED, ""

    @staticmethod
    def _distribution_verdict(patch: Patch) -> Tuple[str, str]:
        """A third-party package outside the releases the record was verified with: tried, and
        unverified (no support table refuses it); not installed: nothing to check."""
        name, spec = patch.distribution_range
        version = installed.distribution_version(name)
        if version is None or version in Range.parse(spec):
            return APPLIED, ""
        return UNVERIFIED, (f"verified with {name} {spec}, not the installed {version}: "
                            f"re-verify it and move the range")

    def _range_verdict(self, patch: Patch, variants: Sequence[Patch], dimension: str, spec: str,
                       version, which: str, table) -> Tuple[str, str]:
        """One range of ``patch`` against the installed ``version`` of ``which``.

        A release outside the table is refused, or (ALLOW_UNVERIFIED) taken as the table's
        nearest release and the record is unverified. Inside the table: before the range, the
        record is skipped; after it, skipped when upstream made it unnecessary (``ends``) or a
        newer variant takes over, and otherwise tried unverified -- a release the table gained
        since the record was verified."""
        if version is None:
            return APPLIED, ""  # nothing installed to check; a missing module stays deferred
        effective, outside_table = version, ranges.row_of(table, version) is None
        if outside_table:
            if not self.allow_unverified:
                return FAILED, (
                    f"patch '{patch.id}' (feature '{patch.feature}') was verified on {which} "
                    f"{spec} but {version} is installed, outside the supported "
                    f"{tables.span(table)}; install a supported release, or set "
                    f"MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1 to try it anyway")
            effective = ranges.text(ranges.nearest(table, version))
        bounds = Range.parse(spec)
        if effective in bounds:
            if not outside_table:
                return APPLIED, ""
            return UNVERIFIED, (f"{which} {version} is outside the support table: tried as "
                                f"{effective}, verified on {spec}")
        if bounds.below(effective):
            note = f": {patch.starts}" if patch.starts else ""
            return SKIPPED, f"for {which} {spec}, not {version}{note}"
        if patch.ends:
            return SKIPPED, f"for {which} {spec}, not {version}: {patch.ends}"
        if any(Range.parse(getattr(other, dimension) or spec).low > bounds.low
               for other in variants if other is not patch):
            return SKIPPED, f"for {which} {spec}, not {version} (a newer variant applies)"
        return UNVERIFIED, (f"verified on {which} {spec}, not on the installed {version}: "
                            f"re-verify it and move the bound (docs/compatibility.md)")
