"""What rank 0 says about the layer at a launch: one line, the table with
``MEGATRON_MUSA_PATCH_LOG=full`` or when a patch failed."""

import types

import pytest

from megatron_musa_patch.core.results import APPLIED, FAILED, SKIPPED, PatchResult
from megatron_musa_patch.activation.session import Session
from megatron_musa_patch.core.settings import Settings


def _session(log, statuses):
    rows = [PatchResult(f"f.p{i}", f"m:x{i}", "f", "wrap", status, "why", False)
            for i, status in enumerate(statuses)]
    device = types.SimpleNamespace(name="cpu", torch_type="cpu", backend="gloo",
                                   memory_stats=False)
    session = Session(settings=Settings(log=log), device=device,
                      registry=types.SimpleNamespace(results=lambda: rows), plugins=None,
                      torch_mapping=types.SimpleNamespace(adapter="builtin"))
    session.versions = lambda: {"megatron_musa_patch": "9.9", "torch": "2.x",
                                "megatron-core": "0.x", "Megatron-LM": "0.x"}
    return session


@pytest.mark.parametrize("log, statuses, table", [
    ("brief", [APPLIED, APPLIED, SKIPPED], False),
    ("brief", [APPLIED, FAILED], True),
    ("full", [APPLIED, SKIPPED], True),
])
def test_one_line_unless_full_or_a_patch_failed(capsys, monkeypatch, log, statuses, table):
    monkeypatch.setenv("RANK", "0")
    session = _session(log, statuses)
    session.log_table_once()
    session.log_table_once()  # once
    out = capsys.readouterr().out
    assert ("status     patch" in out) is table
    if not table:
        assert out.count("\n") == 1
        assert out.startswith("megatron_musa_patch 9.9 on cpu (gloo) | torch 2.x | "
                              "megatron-core 0.x | patches: 2 applied, 1 skipped, 0 failed")
        assert "`mmp patches` lists them" in out


def test_other_ranks_say_nothing(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    _session("full", [FAILED]).log_table_once()
    assert capsys.readouterr().out == ""
