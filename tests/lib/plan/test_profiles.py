"""Device profiles: every shipped one loads and prices ops; a bad one is refused naming why."""

import json

import pytest

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.lib.plan import profile


@pytest.mark.parametrize("name", profile.NAMES)
def test_every_shipped_profile_loads_with_its_sources(name):
    p = profile.load(name)
    assert p.name == name and p.usable_bytes > 0
    for field in ("memory_bytes", "peak_flops", "memory_bandwidth", "links"):
        assert field in p.sources, f"{name}: {field} says nowhere where it comes from"
    # a bigger product never takes less time; a bf16 one is never slower than fp32's
    small, big = p.op_seconds(1e9, 1e6, 16), p.op_seconds(1e11, 1e7, 16)
    assert big > small > 0
    assert p.op_seconds(1e11, 1e7, 16) <= p.op_seconds(1e11, 1e7, 32)
    assert p.collective_seconds("all_reduce", 2 ** 20, 8, 2) > \
        p.collective_seconds("all_reduce", 2 ** 20, 8, 1) > 0


def test_datasheet_figures_are_the_published_ones():
    h100, s4000 = profile.load("h100"), profile.load("s4000")
    assert h100.peak_flops["16"] == pytest.approx(989.4e12)
    assert s4000.memory_bytes == 48 * 10 ** 9 and s4000.memory_bandwidth == 768e9
    assert "announced" in profile.load("s5000").sources["peak_flops"]


def test_unknown_device_lists_the_profiles():
    with pytest.raises(ArgumentError) as err:
        profile.load("a100")
    assert all(name in str(err.value) for name in profile.NAMES)


def test_a_profile_without_a_field_names_it(tmp_path):
    data = json.load(open(profile.load("h200").path))
    del data["memory_bandwidth"]
    del data["links"]["inter_node"]["latency_s"]
    bad = tmp_path / "mine.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ArgumentError) as err:
        profile.load(str(bad))
    assert "memory_bandwidth" in str(err.value)
    assert "links.inter_node.latency_s" in str(err.value)


def test_measured_figures_replace_the_datasheet():
    data = json.load(open(profile.load("cpu").path))
    data["measured"] = {"gemm": {"16": [[1e6, 1e9], [1e9, 1e11]]},
                        "elementwise_bytes_per_s": {"16": 1e10}, "op_overhead_s": 0.0,
                        "math_elements_per_s": 1e9, "step_efficiency": 2.0}
    p = profile.from_dict(data)
    assert p.op_seconds(1e9, 0, 16) == pytest.approx(2.0 * 1e9 / 1e11)
    assert p.op_seconds(0, 1e10, 16) == pytest.approx(2.0)
    assert p.op_seconds(0, 0, 16, elements=10 ** 9) == pytest.approx(2.0)


def test_a_step_prices_its_micro_batches_and_its_update_apart():
    data = json.load(open(profile.load("cpu").path))
    data["measured"] = {"gemm": {"16": [[1e6, 1e9], [1e9, 1e11]]},
                        "elementwise_bytes_per_s": {"16": 1e10}, "op_overhead_s": 0.0,
                        "math_elements_per_s": 1e9, "step_efficiency": 2.0,
                        "update_efficiency": 0.5, "framework_op_overhead_s": 0.25,
                        "fused_bytes_per_s": {"16": 5e9}, "fused_overhead_s": 0.125}
    p = profile.from_dict(data)
    assert p.op_seconds(0, 1e10, 16) == pytest.approx(2.0 + 0.25)
    assert p.op_seconds(0, 1e10, 16, microbatch=False) == pytest.approx(0.5 + 0.25)
    # a compiled region: its bytes at its own rate and call cost; its transcendentals at theirs
    assert p.op_seconds(0, 1e10, 16, fused=True) == pytest.approx((2.0 + 0.125) * 2.0 + 0.25)
    assert p.op_seconds(0, 1e10, 16, elements=10 ** 10, fused=True) == \
        pytest.approx((10.0 + 0.125) * 2.0 + 0.25)


def test_collectives_inside_a_step_pay_their_wake_up_and_overlap_as_measured():
    from megatron_musa_patch.lib.plan import cost

    data = json.load(open(profile.load("cpu").path))
    result = {"stage": 0, "forward_calls": 1,
              "work": {"backward": [[0, 10 ** 9, 32, 0, 0, 1]]},
              "comms": [["all_reduce", 2 ** 20, 2, 1, "forward", False, 3],
                        ["all_reduce", 2 ** 20, 2, 1, "backward", True, 2]]}
    base = dict(data["measured"], collective_in_step_s=0.0)
    plain = cost.price(result, profile.from_dict(dict(data, measured=base)))
    woken = cost.price(result, profile.from_dict(
        dict(data, measured=dict(base, collective_in_step_s=0.01, collective_overlap=0.0))))
    assert woken.forward_s == pytest.approx(plain.forward_s + 3 * 0.01)
    # nothing hides on a device whose collectives share the cores with compute
    one = profile.from_dict(dict(data, measured=base)).collective_seconds(
        "all_reduce", 2 ** 20, 2, 1)
    assert woken.backward_s == pytest.approx(woken.compute_by_phase["backward"]
                                             + 2 * (one + 0.01))


def test_ranks_meeting_inside_a_micro_batch_wait_a_share_of_its_compute():
    from megatron_musa_patch.lib.plan import cost

    data = json.load(open(profile.load("cpu").path))
    work = [[0, 10 ** 9, 32, 0, 0, 1]]
    result = {"stage": 0, "forward_calls": 1, "work": {"forward": work, "backward": work},
              "comms": [["all_gather_into_tensor", 2 ** 18, 2, 1, "forward", False, 4],
                        ["all_reduce", 2 ** 20, 2, 1, "backward", True, 2]]}
    base = dict(data["measured"], collective_wait_share=0.0)
    plain = cost.price(result, profile.from_dict(dict(data, measured=base)))
    waiting = cost.price(result, profile.from_dict(
        dict(data, measured=dict(base, collective_wait_share=0.25))))
    assert waiting.forward_s == pytest.approx(
        plain.forward_s + 0.25 * plain.compute_by_phase["forward"])
    # a pass whose only collectives are asynchronous (gradient buckets) meets no peer
    assert waiting.backward_s == pytest.approx(plain.backward_s)


def test_measured_collectives_price_moe_exchanges_and_a_one_rank_table_is_not_used():
    data = json.load(open(profile.load("cpu").path))
    data["measured"] = {"collectives": {"all_to_all": {
        "ranks": 2, "seconds_by_bytes": [[1024, 4e-4], [2 ** 20, 8e-4]]}}}
    datasheet = profile.from_dict(dict(data, measured={})).collective_seconds(
        "all_to_all_single", 1024, 2, 1)
    assert profile.from_dict(data).collective_seconds("all_to_all_single", 1024, 2, 1) == \
        pytest.approx(4e-4) != datasheet
    # a one-rank calibration's collectives return at once: the link's figures stay
    data["measured"]["collectives"]["all_to_all"]["ranks"] = 1
    assert profile.from_dict(data).collective_seconds("all_to_all_single", 1024, 2, 1) == \
        pytest.approx(datasheet)


def _calibrated_collectives(rank, port, out):
    import os

    import torch
    import torch.distributed as dist

    from megatron_musa_patch.cli.plan_calibrate_rank import collectives

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        table = collectives(torch.device("cpu"), [4096, 65536])
        if rank == 0:
            out.put(table)
    finally:
        dist.destroy_process_group()


def test_the_calibration_times_every_kind_of_collective_a_plan_prices():
    import socket

    import torch.multiprocessing as mp

    from megatron_musa_patch.lib.plan.kinds import kind_of

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_calibrated_collectives, args=(port, queue), nprocs=2,
                       start_method="spawn")
    table = queue.get()
    kinds = {kind_of(op) for op in ("all_reduce", "all_gather_into_tensor",
                                    "reduce_scatter_tensor", "all_to_all_single", "isend")}
    assert set(table) == kinds
    for kind in kinds:
        assert table[kind]["ranks"] == 2
        assert [size for size, _ in table[kind]["seconds_by_bytes"]] == [4096, 65536]
        assert all(seconds > 0 for _, seconds in table[kind]["seconds_by_bytes"])
