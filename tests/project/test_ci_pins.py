"""CI runs both ends of both support tables, and says what it installs.

.ci/run pins the oldest torch with the oldest megatron-core and the newest torch with the newest
megatron-core of megatron_musa_patch/upstream/tables.py; scripts/bootstrap.sh defaults to the
oldest torch and points pip at the project's own constraints (not a machine-wide pip
configuration)."""

import re

from megatron_musa_patch.upstream import tables
from megatron_musa_patch.upstream.ranges import release, row_of

from tests.conftest import REPO


def _assignments(text: str) -> dict:
    return dict(re.findall(r"\b(\w+)=([0-9][\w.]*)", text))


def test_ci_runs_both_ends_of_both_tables():
    pins = _assignments((REPO / ".ci" / "run").read_text())
    assert pins["oldest_torch"] == tables.TORCH[0].first
    assert row_of(tables.TORCH, pins["newest_torch"]) is tables.TORCH[-1]
    assert pins["oldest_core"] == tables.MEGATRON[0].first
    assert row_of(tables.MEGATRON, pins["newest_core"]) is tables.MEGATRON[-1]
    assert release(pins["newest_core"]) >= release(tables.MEGATRON[-1].first)


def test_bootstrap_defaults_to_the_oldest_torch_and_the_projects_constraints():
    script = (REPO / "scripts" / "bootstrap.sh").read_text()
    assert re.search(r"torch_version=\$\{TORCH_VERSION:-" + re.escape(tables.TORCH[0].first)
                     + r"\}", script)
    assert 'export PIP_CONSTRAINT="$PWD/scripts/constraints.txt"' in script
