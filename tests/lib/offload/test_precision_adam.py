"""PrecisionAwareAdamW: TE FusedAdam's precision-aware interface with torch's Adam kernels."""

import functools

import pytest
import torch

from megatron_musa_patch.lib.offload.precision_adam import PrecisionAwareAdamW

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def gradients(shape, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) * 1e-2 for _ in range(steps)]


def run_reference(start, grads, cls=torch.optim.AdamW, **kw):
    param = start.clone().float().requires_grad_(False)
    opt = cls([param], **HYPER, **kw)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    return param, opt


@pytest.mark.parametrize("impl", [{}, {"foreach": True}, {"fused": True}],
                         ids=["single", "foreach", "fused"])
def test_fp32_everything_is_torch_adamw_bit_for_bit(impl):
    start = torch.randn(64)
    grads = gradients(64, 5)
    ref, _ = run_reference(start, grads, **impl)
    param = start.clone()
    opt = PrecisionAwareAdamW([param], **HYPER, **impl)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    assert torch.equal(param, ref)


def test_adam_mode_without_decoupled_weight_decay_is_torch_adam():
    start, grads = torch.randn(32), gradients(32, 4)
    ref, _ = run_reference(start, grads, cls=torch.optim.Adam)
    param = start.clone()
    opt = PrecisionAwareAdamW([param], **HYPER, adam_w_mode=False)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    assert torch.equal(param, ref)


def test_bf16_weights_fp32_master_from_decoupled_grad():
    start, grads = torch.randn(128), gradients(128, 6)
    ref, _ = run_reference(start.to(BF16).float(), grads)
    param = start.to(BF16)
    opt = PrecisionAwareAdamW([param], **HYPER, master_weights=True, use_decoupled_grad=True)
    for g in grads:
        param.grad = None
        param.decoupled_grad = g.clone()  # the grad buffer's shard: may differ in dtype
        opt.step()
    state = opt.state[param]
    assert state["master_param"].dtype == FP32 and torch.equal(state["master_param"], ref)
    assert torch.equal(param, ref.to(BF16))  # the model weights take the master's value


def test_16_bit_state_is_stored_16_bit_and_stays_close():
    start, grads = torch.randn(256), gradients(256, 10)
    ref, ref_opt = run_reference(start, grads)
    param = start.clone()
    opt = PrecisionAwareAdamW([param], **HYPER, master_weights=True, master_weight_dtype=FP16,
                              exp_avg_dtype=BF16, exp_avg_sq_dtype=BF16)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    state = opt.state[param]
    assert (state["exp_avg"].dtype, state["exp_avg_sq"].dtype,
            state["master_param"].dtype) == (BF16, BF16, FP16)
    assert not torch.equal(param, ref)
    torch.testing.assert_close(param, ref, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(state["exp_avg"].float(), ref_opt.state[ref]["exp_avg"],
                               atol=1e-4, rtol=1e-2)


def test_parameters_without_gradient_are_left_alone():
    a, b = torch.ones(4), torch.ones(4)
    opt = PrecisionAwareAdamW([a, b], **HYPER, use_decoupled_grad=True)
    a.decoupled_grad = torch.ones(4)
    opt.step()
    assert not torch.equal(a, torch.ones(4)) and torch.equal(b, torch.ones(4))
    assert len(opt.state[b]) == 0


def test_checkpoint_interface_get_unscaled_set_scaled_initialize():
    param = torch.randn(16).to(BF16)
    opt = PrecisionAwareAdamW([param], **HYPER, master_weights=True, exp_avg_dtype=BF16)
    opt.initialize_state(param)
    state = opt.state[param]
    assert set(state) == {"step", "exp_avg", "exp_avg_sq", "master_param"}
    # fp32 state is handed out as itself (in-place loads land in it), 16-bit as an fp32 copy
    assert opt.get_unscaled_state(param, "master_param") is state["master_param"]
    unscaled = opt.get_unscaled_state(param, "exp_avg")
    assert unscaled.dtype == FP32 and unscaled is not state["exp_avg"]
    opt.set_scaled_state(param, "exp_avg", torch.full((16,), 0.5))
    assert state["exp_avg"].dtype == BF16 and torch.all(state["exp_avg"] == 0.5)
    opt.set_scaled_state(param, "master_param", torch.full((16,), 1.0 + 2 ** -20))
    assert state["master_param"][0].item() == 1.0 + 2 ** -20  # fp32 precision kept
    opt.set_scaled_state(param, "step", torch.tensor(7.0))
    assert float(state["step"]) == 7.0
    opt.set_scaled_state(param, "padding", False)  # checkpoint bookkeeping: ignored
    assert "padding" not in state


def test_load_state_dict_keeps_an_fp32_master_of_a_bf16_parameter():
    param = torch.randn(16).to(BF16)
    opt = PrecisionAwareAdamW([param], **HYPER, master_weights=True)
    param.grad = torch.randn(16).to(BF16)
    opt.step()
    saved = opt.state_dict()
    master = saved["state"][0]["master_param"].clone()
    assert not torch.equal(master, master.to(BF16).float())  # more precise than the weights
    other = torch.zeros(16, dtype=BF16)
    fresh = PrecisionAwareAdamW([other], **HYPER, master_weights=True)
    fresh.load_state_dict(saved)  # torch alone would cast the master to bf16
    assert fresh.state[other]["master_param"].dtype == FP32
    assert torch.equal(fresh.state[other]["master_param"], master)


def test_configured_is_a_picklable_class_with_defaults():
    import pickle

    cls = PrecisionAwareAdamW.configured(exp_avg_dtype=BF16)
    assert isinstance(cls, functools.partial)
    opt = pickle.loads(pickle.dumps(cls))([torch.zeros(2)], lr=0.1)
    assert opt.state_dtypes["exp_avg"] == BF16


@pytest.mark.parametrize("kwargs", [dict(exp_avg_sq_dtype=FP16), dict(exp_avg_dtype=torch.uint8),
                                    dict(master_weight_dtype=BF16), dict(amsgrad=True)])
def test_refuses_what_it_cannot_store_safely(kwargs):
    with pytest.raises(ValueError):
        PrecisionAwareAdamW([torch.zeros(2)], **kwargs)
