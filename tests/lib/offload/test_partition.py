"""offload.partition: which parameters are stepped on the host, and their host copies."""

import pytest
import torch

from megatron_musa_patch.lib.offload import partition


def groups(*sizes_per_group, dtype=torch.float32):
    torch.manual_seed(0)
    return [{"params": [torch.randn(n, dtype=dtype) for n in sizes], "lr": 0.1 * (i + 1)}
            for i, sizes in enumerate(sizes_per_group)]


def split(param_groups, fraction, *, on_device=None, fp32_masters=False, pin=False):
    return partition.split(param_groups, fraction,
                           on_device=on_device or partition.on_device_of("cpu"),
                           to_host=partition.host_tensor_maker(pin), fp32_masters=fp32_masters)


def test_fraction_one_moves_every_parameter_to_own_host_memory():
    pg = groups([10, 20], [30])
    result = split(pg, 1.0)
    assert result.device_groups == []
    hosts = [p for g in result.host_groups for p in g["params"]]
    owners = [p for g in pg for p in g["params"]]
    assert len(hosts) == 3
    for host, owner in zip(hosts, owners):
        assert result.host_copy[owner] is host and result.host_owner[host] is owner
        assert torch.equal(host, owner)
        assert host.untyped_storage().data_ptr() != owner.untyped_storage().data_ptr()
    # group options (lr, ...) travel with the parameters
    assert [g["lr"] for g in result.host_groups] == [0.1, 0.2]


def test_half_follows_upstreams_rule_parameters_in_order_until_the_line_is_crossed():
    pg = groups([40, 30, 20, 10])  # 100 elements: 40 < 50, 40+30 crosses 50 -> stop after it
    result = split(pg, 0.5)
    host = [p.numel() for g in result.host_groups for p in g["params"]]
    device = [p.numel() for g in result.device_groups for p in g["params"]]
    assert host == [40, 30] and device == [20, 10]
    # device-side parameters are stepped as themselves (no copy)
    assert result.device_groups[0]["params"][0] is pg[0]["params"][2]


@pytest.mark.parametrize("fraction,expected_host", [(0.01, 1), (0.4, 1), (0.41, 2), (1.0, 4)])
def test_fraction_boundaries(fraction, expected_host):
    result = split(groups([40, 30, 20, 10]), fraction)
    assert sum(len(g["params"]) for g in result.host_groups) == expected_host


def test_parameters_off_the_device_are_not_copied():
    pg = groups([10, 10])
    first = pg[0]["params"][0]
    result = split(pg, 1.0, on_device=lambda t: t is not first)
    assert [p for g in result.device_groups for p in g["params"]] == [first]
    assert first not in result.host_copy


def test_fp32_masters_for_16_bit_parameters_host_copy_is_the_master():
    pg = groups([16, 16], dtype=torch.bfloat16)
    result = split(pg, 0.5, fp32_masters=True)
    offloaded, kept = pg[0]["params"]
    host = result.host_copy[offloaded]
    assert host.dtype == torch.float32 and result.fp32_master[offloaded] is host
    assert torch.equal(host, offloaded.float())
    device_master = result.fp32_master[kept]
    assert device_master.dtype == torch.float32 and device_master is not kept
    assert result.device_groups[0]["params"] == [device_master]


def test_fp32_parameters_need_no_master():
    result = split(groups([8, 8]), 0.5, fp32_masters=True)
    assert result.fp32_master == {}


def test_host_tensor_maker_pins_on_request():
    calls = []
    real_empty = torch.empty

    def spy(*args, **kwargs):
        calls.append(kwargs.get("pin_memory"))
        kwargs["pin_memory"] = False  # no accelerator here to pin with
        return real_empty(*args, **kwargs)

    torch.empty, saved = spy, torch.empty
    try:
        partition.host_tensor_maker(True)(torch.ones(3), torch.float32)
        partition.host_tensor_maker(False)(torch.ones(3), torch.float16)
    finally:
        torch.empty = saved
    assert calls == [True, False]


def test_as_upstream_is_the_five_structures_in_upstreams_order():
    result = split(groups([4]), 1.0)
    assert result.as_upstream() == (result.host_groups, result.device_groups, result.host_copy,
                                    result.host_owner, result.fp32_master)


@pytest.mark.parametrize("row_pins,flag,expected", [(True, True, True), (True, False, False),
                                                    (False, True, False)])
def test_hybrid_pins_host_copies_where_the_row_has_pinned_memory(monkeypatch, row_pins, flag,
                                                                 expected):
    import types

    from megatron_musa_patch.lib.offload import hybrid

    row = types.SimpleNamespace(name="fake", torch_type="cpu", pinned_memory=row_pins)
    asked = []
    real_maker = partition.host_tensor_maker
    monkeypatch.setattr(partition, "host_tensor_maker",
                        lambda pin: asked.append(pin) or real_maker(False))
    fake = types.SimpleNamespace(param_groups=groups([4, 4]), pin_cpu_params=flag,
                                 param_update_in_fp32=True)
    host_groups, device_groups, *_ = hybrid.split_param_groups_for(row)(fake, 1.0)
    assert asked == [expected] and len(host_groups[0]["params"]) == 2 and device_groups == []
