"""What became of each record: its status and why, one row each (``mmp doctor``, ``mmp patches``)."""

from __future__ import annotations

import dataclasses

APPLIED, DEFERRED, SKIPPED, FAILED = "applied", "deferred", "skipped", "failed"
#: applied on a release outside the record's verified range (a release added to a table since,
#: or one outside the tables under MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED)
UNVERIFIED = "unverified"
#: the statuses of a record that is in effect
IN_EFFECT = (APPLIED, UNVERIFIED)


@dataclasses.dataclass
class PatchResult:
    id: str
    target: str
    feature: str
    kind: str
    status: str
    reason: str = ""
    strict: bool = False
    #: the version range, when the id has several variants ("" otherwise)
    variant: str = ""
    #: the megatron-core and torch releases the record was verified on
    megatron: str = ""
    torch: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
