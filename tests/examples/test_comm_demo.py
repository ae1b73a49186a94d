"""examples/comm/comm_bench.py: the collectives demo on 2 CPU ranks (gloo), results checked.

The checker's expected values are first checked against a plain simulation of each collective
(3 ranks, no torch.distributed), so a wrong expectation cannot pass as "0 wrong"."""

import importlib.util
import json
import sys

import pytest
import torch

from tests.conftest import REPO, subprocess_env

pytestmark = pytest.mark.ranks

SCRIPT = REPO / "examples" / "comm" / "comm_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("comm_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # main() activates the layer; importing does not
    return module


def simulate(bench, op, count, n):
    """Each rank's result of ``op``, computed from every rank's input by hand."""
    ins = [bench.inputs(op, count, r, n, torch.float64, "cpu")[0] for r in range(n)]
    per = count // n
    if op == "all_reduce":
        return [sum(ins)] * n
    if op == "all_gather":
        return [torch.cat(ins)] * n
    if op == "reduce_scatter":
        return [sum(ins)[r * per:(r + 1) * per] for r in range(n)]
    if op == "alltoall":
        return [torch.cat([ins[q][r * per:(r + 1) * per] for q in range(n)]) for r in range(n)]
    if op == "broadcast":
        return [ins[0]] * n
    if op == "sendrecv":
        return [ins[(r - 1) % n] for r in range(n)]
    raise ValueError(op)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "alltoall",
                                "broadcast", "sendrecv"])
def test_expected_values_match_a_simulation(bench, op):
    n, count = 3, 21
    for rank, result in enumerate(simulate(bench, op, count, n)):
        assert bench.count_wrong(result, bench.expected(op, count, rank, n)) == 0
    wrong = simulate(bench, op, count, n)[1].clone()
    wrong[0] += 1
    assert bench.count_wrong(wrong, bench.expected(op, count, 1, n)) == 1


def test_bus_factors_and_sizes(bench):
    assert bench.bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bench.bus_factor("all_gather", 4) == 0.75
    assert bench.bus_factor("sendrecv", 8) == 1.0
    # whole elements per rank: 4-byte floats on 2 ranks -> multiples of 8 bytes
    assert bench.sizes(8, 1024, 4, 4, 2) == [8, 32, 128, 512]
    assert bench.sizes(1, 64, 2, 4, 2) == [8, 16, 32, 64]
    assert bench._bytes("64M") == 64 << 20


def test_two_cpu_ranks_gloo(tmp_path):
    """Through ``mmp run`` (the layer active in each rank): every collective, every size checked
    element by element on both ranks."""
    import subprocess

    from tests.harness.stock import mmp_executable

    out = tmp_path / "comm.json"
    proc = subprocess.run(
        [mmp_executable(), "run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
         "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "--json", str(out)],
        env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ranks"] == 2 and result["backend"] == "gloo" and result["wrong"] == 0
    assert sorted(result["ops"]) == sorted(["all_reduce", "all_gather", "reduce_scatter",
                                            "alltoall", "broadcast", "sendrecv"])
    for op, rows in result["ops"].items():
        assert [r["size"] for r in rows] == [8, 64, 512, 4096, 32768, 262144], op
        for r in rows:
            assert r["wrong"] == 0 and r["time_us"] > 0
            assert r["busbw"] == pytest.approx(r["algbw"] * (1.0 if op in (
                "all_reduce", "broadcast", "sendrecv") else 0.5))  # 2(n-1)/n = 1 for n = 2
    assert "backend gloo" in proc.stdout and "# Out of bounds values : 0 OK" in proc.stdout
    assert "busbw = algbw x 1" in proc.stdout  # the all_reduce header


def test_bad_option_is_refused():
    import subprocess

    proc = subprocess.run([sys.executable, str(SCRIPT), "--ops", "all_reduce,gather"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--ops: unknown ['gather']" in proc.stderr
