"""megatron-core GPT on 2 CPU ranks (gloo) in each parallel layout, against the 1-rank run.

This is ``mmp selftest``: the same initial weights (resharded from a distributed checkpoint of
the 1-rank model) and batches, fp32, dropout off. Runs in CI without a Megatron-LM checkout.
"""

import json

import pytest

from tests.conftest import run_python, subprocess_env

pytestmark = pytest.mark.ranks

TOLERANCE = 5e-5  # the selftest's default: fp32 rounding of split sums, see its docstring
LAYOUTS = ["tp2", "pp2", "vpp2", "dp2", "dp2-distopt"]


@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
    out = tmp_path_factory.mktemp("selftest") / "result.json"
    proc = run_python(
        "import sys; from megatron_musa_patch.cli.selftest import main; sys.exit(main(sys.argv[1:]))",
        args=("--layouts", ",".join(LAYOUTS), "--steps", "5", "--json", str(out)),
        env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_reference_loss_falls(selftest):
    _, result = selftest
    ref = result["reference"]
    assert result["device"] == "cpu" and len(ref) == 5
    assert ref[-1] < ref[0] - 0.5, ref  # the task (next token = token + 1) is learnable


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_matches_one_rank(selftest, layout):
    _, result = selftest
    res = result["layouts"][layout]
    assert "error" not in res, res.get("error")
    worst = max(abs(a - b) for a, b in zip(res["losses"], result["reference"]))
    assert len(res["losses"]) == len(result["reference"])
    assert worst <= TOLERANCE, (layout, res["losses"], result["reference"])


def test_selftest_reports_and_exits_cleanly(selftest):
    proc, result = selftest
    assert result["ok"] and proc.returncode == 0
    assert "selftest passed" in proc.stdout and "patches:" in proc.stdout
    lines = proc.stdout.splitlines()
    # each run is named as it starts, before its result; the layer is one line, not its table
    assert lines[0] == "mmp selftest: reference (dense model) on 1 rank"
    for layout in LAYOUTS:
        start = lines.index(next(l for l in lines if l.startswith(f"mmp selftest: {layout} on "
                                                                  f"2 ranks")))
        assert lines.index(next(l for l in lines if l.startswith(f"{layout} "))) > start
    assert "status     patch" not in proc.stdout
    assert sum(l.startswith("megatron_musa_patch ") and "patches:" in l for l in lines) == 1
