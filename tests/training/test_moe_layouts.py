"""A DeepSeek-V2-Lite-shaped megatron-core model (MLA, MoE with a shared expert) on 2 CPU ranks.

Expert parallelism with both dispatchers (the alltoall one passes an .is_cuda gate on the CPU
row), pipeline and data parallelism must match the 1-rank run; the device-level balancing
losses and capacity, set on the TransformerConfig as a megatron-core user would, must train
and change the trajectory.
"""

import json
import math

import pytest

from tests.conftest import run_python, subprocess_env

pytestmark = pytest.mark.ranks

LAYOUTS = ["ep2", "ep2-allgather", "pp2", "dp2-distopt"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe") / "result.json"
    proc = run_python(
        "import sys; from megatron_musa_patch.cli.selftest import main; sys.exit(main(sys.argv[1:]))",
        args=("--model", "deepseek", "--layouts", ",".join(LAYOUTS), "--steps", "4",
              "--json", str(out), "--keep", str(out.parent / "runs")),
        env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), out.parent / "runs"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_matches_one_rank(deepseek, layout):
    result, _ = deepseek
    res = result["layouts"][layout]
    assert "error" not in res, res.get("error")
    worst = max(abs(a - b) for a, b in zip(res["losses"], result["reference"]))
    assert worst <= TOLERANCE, (layout, res["losses"], result["reference"])
    assert result["reference"][-1] < result["reference"][0]


def test_device_level_balancing_trains_and_changes_the_run(deepseek):
    from megatron_musa_patch.cli.selftest import run_worker

    result, runs = deepseek
    flags = ["--steps", "4", "--experts", "4", "--mla", "--ep", "2", "--load-init",
             str(runs / "init"), "--device-loss", "0.5", "--comm-loss", "0.5",
             "--device-capacity", "1.0"]
    balanced = run_worker(2, flags, str(runs / "balanced.json"), str(runs), timeout=600)
    losses = balanced["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    # the extra losses and the dropped tokens change what the model learns
    assert max(abs(a - b) for a, b in zip(losses, result["layouts"]["ep2"]["losses"])) > 1e-4
