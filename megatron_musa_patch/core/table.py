"""The patch table: ``mmp doctor``, ``mmp patches`` and the rank-0 log line."""

from __future__ import annotations

import collections
import contextlib
import sys
from typing import List

from .results import APPLIED, DEFERRED, FAILED, IN_EFFECT, SKIPPED, UNVERIFIED, PatchResult

_ORDER = {FAILED: 0, UNVERIFIED: 1, SKIPPED: 2, DEFERRED: 3, APPLIED: 4}


def header(state) -> str:
    """``state``: the session."""
    v = state.versions()
    return (
        f"megatron_musa_patch {v['megatron_musa_patch'] or '(source)'} | device "
        f"{state.device.name} (torch '{state.device.torch_type}', collectives "
        f"{state.device.backend}) | torch {v['torch']} | megatron-core {v['megatron-core']} | "
        f"Megatron-LM {v['Megatron-LM']}{_mapping(state)}"
    )


def summary(state) -> str:
    """The one line a launch prints about the layer (``MEGATRON_MUSA_PATCH_LOG=brief``)."""
    v = state.versions()
    counts = collections.Counter(r.status for r in state.registry.results())
    said = ", ".join(f"{counts[s]} {s}" for s in (APPLIED, UNVERIFIED, DEFERRED, SKIPPED, FAILED)
                     if counts[s] or s in (APPLIED, FAILED))
    return (f"megatron_musa_patch {v['megatron_musa_patch'] or '(source)'} on "
            f"{state.device.name} ({state.device.backend}) | torch {v['torch']} | megatron-core "
            f"{v['megatron-core']} | patches: {said} (`mmp patches` lists them; "
            f"MEGATRON_MUSA_PATCH_LOG=full prints the table here)")


def shown_id(row: PatchResult) -> str:
    """The id as the table shows it: with the version range of a variant."""
    return f"{row.id} [{row.variant}]" if row.variant else row.id


def _mapping(state) -> str:
    mapping = getattr(state, "torch_mapping", None)
    if mapping is None or mapping.adapter != "torchada":
        return ""
    return f" | torch mapped by torchada {mapping.version}"


def grouped(rows: List[PatchResult]) -> List[PatchResult]:
    """One row per (id prefix, status) when a feature patches many sibling names alike."""
    groups = collections.OrderedDict()
    for row in rows:
        if row.variant:
            groups.setdefault((row.id, row.status, row.variant), []).append(row)
            continue
        prefix = row.id.rsplit(".", 1)[0]
        groups.setdefault((prefix, row.status, row.reason), []).append(row)
    out = []
    for (prefix, status, reason), members in groups.items():
        if len(members) < 4:
            out.extend(members)
            continue
        module = members[0].target.split(":", 1)[0]
        out.append(PatchResult(f"{prefix}.* ({len(members)})", f"{module}:*", members[0].feature,
                               members[0].kind, status, reason, members[0].strict))
    return out


def render_table(state, collapse: bool = True) -> str:
    return "\n".join([header(state)] + _rows_table("patches", state.registry.results(),
                                                   collapse))


def render_launcher_table(rows: List[PatchResult]) -> str:
    """The launcher's records (``mmp_register_launcher_patches``), below the ranks' table."""
    return "\n".join(_rows_table("launcher patches", rows, collapse=False))


def _rows_table(title: str, rows: List[PatchResult], collapse: bool) -> List[str]:
    counts = collections.Counter(r.status for r in rows)
    shown = grouped(rows) if collapse else rows
    shown = sorted(shown, key=lambda r: (r.feature != "device", r.feature, _ORDER[r.status]))
    width_id = max([len(shown_id(r)) for r in shown] + [5])
    width_target = min(max([len(r.target) for r in shown] + [6]), 72)
    lines = [f"{title}: " + ", ".join(f"{counts[s]} {s}" for s in (APPLIED, UNVERIFIED, DEFERRED,
                                                                    SKIPPED, FAILED)),
             f"{'status':10} {'patch':{width_id}} {'target':{width_target}} reason"]
    for r in shown:
        target = r.target if len(r.target) <= width_target else "..." + r.target[-width_target + 3:]
        lines.append(f"{r.status:10} {shown_id(r):{width_id}} {target:{width_target}} {r.reason}")
    return lines


def as_json(state) -> dict:
    return {
        "device": {"name": state.device.name, "torch_type": state.device.torch_type,
                   "backend": state.device.backend, "memory_stats": state.device.memory_stats},
        "versions": state.versions(),
        "torch_mapping": {"adapter": state.torch_mapping.adapter,
                          "summary": state.torch_mapping.describe(state.registry.results())},
        "patches": [r.as_dict() for r in state.registry.results()],
    }


def resolutions(registry) -> List[dict]:
    """Every record of ``registry`` with its target resolved on the installed releases, whatever
    the device: one dict per record (``id``, ``megatron``, ``torch``, ``target``, ``devices``,
    ``for_this_release``, ``verified``, ``status``, ``detail``). ``verified`` is False for a
    record meant for this release that was not verified on it (a release the tables gained
    since, or one outside them under ALLOW_UNVERIFIED)."""
    out = []
    for patch in registry.patches():
        verdict, why = registry.verdict(patch)
        # what an imported module prints (dlrover says torch_musa is missing) is not the report's
        with contextlib.redirect_stdout(sys.stderr):
            status, detail = registry.resolve(patch)
        out.append({"id": patch.id, "megatron": patch.megatron, "torch": patch.torch or "",
                    "target": patch.target, "feature": patch.feature,
                    "devices": registry.devices_of(patch), "for_this_release": verdict in IN_EFFECT,
                    "verified": verdict == APPLIED, "unverified_because": why
                    if verdict == UNVERIFIED else "", "status": status, "detail": detail})
    return out


def unresolved(rows: List[dict]) -> List[dict]:
    """Records meant for this release whose target is not there."""
    return [r for r in rows if r["for_this_release"] and r["status"] in ("missing",
                                                                          "not importable")]


def unverified(rows: List[dict]) -> List[dict]:
    """Records meant for this release that were not verified on it."""
    return [r for r in rows if r["for_this_release"] and not r["verified"]]


def render_resolutions(rows: List[dict]) -> str:
    bad, unchecked = unresolved(rows), unverified(rows)
    lines = [f"{len(rows)} records: {sum(r['status'] == 'resolved' for r in rows)} resolved, "
             f"{len(bad)} meant for this release do not resolve, {len(unchecked)} meant for "
             f"this release are unverified on it"]
    for r in sorted(rows, key=lambda r: (r["status"] == "resolved", r["verified"], r["id"])):
        release = "" if r["for_this_release"] else " (another release's)"
        mark = " UNVERIFIED" if r in unchecked else ""
        lines.append(f"{r['status']:14} {r['id']}{release}{mark} {r['target']} "
                     f"{r['detail'] or r['unverified_because']}".rstrip())
    return "\n".join(lines)
