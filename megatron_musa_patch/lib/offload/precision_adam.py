"""``PrecisionAwareAdamW``: the precision-aware optimizer without TransformerEngine.

What megatron-core asks of TE's ``FusedAdam`` when ``--use-precision-aware-optimizer`` is on,
done with torch's own Adam kernels:

* master weights (``master_weights=True``) in ``master_weight_dtype``, kept in the optimizer
  state as ``master_param``; after each step the model weights (the distributed optimizer's
  shards of the param buffer, e.g. bf16) get the master's value;
* moments ``exp_avg`` / ``exp_avg_sq`` stored in ``exp_avg_dtype`` / ``exp_avg_sq_dtype``;
* gradients read from ``param.decoupled_grad`` (``use_decoupled_grad=True``): the distributed
  optimizer hands over the grad buffer's shard there, so it may differ in dtype from the param;
* ``get_unscaled_state`` / ``set_scaled_state`` / ``initialize_state`` for checkpointing.

Each step upcasts what is stored in lower precision to fp32, runs torch's functional ``adam``
(single-tensor, foreach or fused, as the group says) and stores the results back. When every
dtype is fp32 nothing is copied and the update is torch's ``AdamW`` bit for bit.

With ``master_weights=False`` the parameter itself is updated (the hybrid optimizer's fp32
masters, when only the moments are to be stored in lower precision).

``step`` is kept per parameter, like torch's Adam, which the distributed optimizer's checkpoint
code expects when neither TE nor Apex is installed.
"""

from __future__ import annotations

import functools
from itertools import chain
import torch
from torch.optim.adam import adam as functional_adam
from torch.optim.optimizer import _get_scalar_dtype

from . import dtypes as dtype_rules

FP32 = torch.float32


class PrecisionAwareAdamW(torch.optim.Adam):
    """Adam(W) with master weights and moments in chosen dtypes (see the module docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 adam_w_mode: bool = True, bias_correction: bool = True,
                 master_weights: bool = False, master_weight_dtype=FP32, exp_avg_dtype=FP32,
                 exp_avg_sq_dtype=FP32, use_decoupled_grad: bool = False,
                 store_param_remainders: bool = False, amsgrad: bool = False,
                 foreach=None, fused=None, capturable: bool = False, **_te_only):
        options = dict(master_weights=master_weights, master_weight_dtype=master_weight_dtype,
                       exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype,
                       use_decoupled_grad=use_decoupled_grad)
        if not bias_correction:
            raise ValueError("PrecisionAwareAdamW always applies Adam's bias correction")
        if amsgrad or store_param_remainders:
            raise ValueError("PrecisionAwareAdamW supports neither amsgrad nor "
                             "store_param_remainders (TE-only)")
        for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
            if options[key] not in dtype_rules.MOMENT_DTYPES[key]:
                raise ValueError(f"{key}={options[key]} is not supported without "
                                 f"TransformerEngine (see megatron_musa_patch.lib.offload.dtypes)")
        if options["master_weight_dtype"] not in (FP32, torch.float16):
            raise ValueError(f"master_weight_dtype={options['master_weight_dtype']}: use fp32 "
                             f"or fp16")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=False, foreach=foreach, fused=fused, capturable=capturable,
                         decoupled_weight_decay=adam_w_mode)
        self.master_weights = bool(options["master_weights"])
        self.use_decoupled_grad = bool(options["use_decoupled_grad"])
        #: state key -> the dtype it is stored in
        self.state_dtypes = {"exp_avg": options["exp_avg_dtype"],
                             "exp_avg_sq": options["exp_avg_sq_dtype"]}
        if self.master_weights:
            self.state_dtypes["master_param"] = options["master_weight_dtype"]

    @classmethod
    def configured(cls, **options):
        """The class with these keyword defaults, for callers that pass only param groups (the
        hybrid optimizer building its sub-optimizers). A ``functools.partial``: it is stored in
        the optimizer's param groups, so checkpoints must be able to pickle it."""
        return functools.partial(cls, **options)

    # ------------------------------------------------------------------ state

    def _grad(self, param):
        if self.use_decoupled_grad:
            return getattr(param, "decoupled_grad", None)
        return param.grad

    def _group_of(self, param):
        for group in self.param_groups:
            if any(p is param for p in group["params"]):
                return group
        raise KeyError("parameter not in this optimizer")

    def _new_step(self, param, group, value: float = 0.0):
        if group["fused"] or group["capturable"]:
            return torch.full((), value, dtype=_get_scalar_dtype(is_fused=group["fused"]),
                              device=param.device)
        return torch.tensor(value, dtype=_get_scalar_dtype())

    def _init_state(self, param, state, group):
        state["step"] = self._new_step(param, group)
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = torch.zeros_like(param, dtype=self.state_dtypes[key])
        if self.master_weights:
            state["master_param"] = param.detach().to(self.state_dtypes["master_param"],
                                                      copy=True)

    def _conform(self, param, state, group):
        """After a checkpoint load: state tensors in their dtypes, on the param's device."""
        for key, dtype in self.state_dtypes.items():
            value = state.get(key)
            if value is None:
                state[key] = (param.detach().to(dtype, copy=True) if key == "master_param"
                              else torch.zeros_like(param, dtype=dtype))
            elif value.dtype != dtype or value.device != param.device:
                state[key] = value.to(device=param.device, dtype=dtype)
        step = state.get("step")
        if step is None or (torch.is_tensor(step) and (group["fused"] or group["capturable"])
                            and step.device != param.device):
            state["step"] = self._new_step(param, group, float(step) if step is not None else 0.)
        elif not torch.is_tensor(step):
            state["step"] = self._new_step(param, group, float(step))

    def initialize_state(self, param):
        state = self.state[param]
        if not state:
            self._init_state(param, state, self._group_of(param))

    def get_unscaled_state(self, param, key):
        """The state in fp32: the stored tensor itself when it is fp32 (so in-place checkpoint
        loads land in it), else an fp32 copy."""
        value = self.state[param][key]
        if key == "step" or not torch.is_tensor(value) or value.dtype == FP32:
            return value
        return value.float()

    def set_scaled_state(self, param, key, value):
        if not torch.is_tensor(value):
            return  # bookkeeping of the checkpoint format (e.g. ``padding``), not state
        state = self.state[param]
        if key == "step":
            group = self._group_of(param)
            state["step"] = self._new_step(param, group, float(value))
            return
        dtype = self.state_dtypes.get(key, value.dtype)
        current = state.get(key)
        if current is value and value.dtype == dtype:
            return
        if current is not None and current.dtype == dtype and current.shape == value.shape:
            current.copy_(value)
        else:
            state[key] = value.detach().to(device=param.device, dtype=dtype, copy=True)

    def load_state_dict(self, state_dict):
        """torch casts loaded state to the param's dtype (an fp32 master of a bf16 param would
        become bf16): keep the loaded tensors in their own dtypes instead."""
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        incoming = dict(state_dict["state"])
        super().load_state_dict(state_dict)
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for index, param in zip(saved_ids, params):
            values = incoming.get(index)
            if not values:
                continue
            state = self.state[param]
            for key, dtype in self.state_dtypes.items():
                if torch.is_tensor(values.get(key)):
                    state[key] = values[key].to(device=param.device, dtype=dtype)

    # ------------------------------------------------------------------ step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            work = {"params": [], "grads": [], "exp_avgs": [], "exp_avg_sqs": [], "steps": []}
            write_back = []
            for param in group["params"]:
                grad = self._grad(param)
                if grad is None:
                    continue
                state = self.state[param]
                if not state:
                    self._init_state(param, state, group)
                else:
                    self._conform(param, state, group)
                target = state["master_param"] if self.master_weights else param
                fp32 = [_fp32(target), _fp32(state["exp_avg"]), _fp32(state["exp_avg_sq"])]
                for key, value in zip(("params", "exp_avgs", "exp_avg_sqs"), fp32):
                    work[key].append(value)
                work["grads"].append(_fp32(grad))
                work["steps"].append(state["step"])
                write_back.append((param, target, state, fp32))
            if not write_back:
                continue
            beta1, beta2 = group["betas"]
            functional_adam(
                work["params"], work["grads"], work["exp_avgs"], work["exp_avg_sqs"], [],
                work["steps"], foreach=group["foreach"], capturable=group["capturable"],
                differentiable=False, fused=group["fused"], grad_scale=None, found_inf=None,
                has_complex=False, decoupled_weight_decay=group["decoupled_weight_decay"],
                amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                weight_decay=group["weight_decay"], eps=group["eps"],
                maximize=group["maximize"])
            for param, target, state, (t32, m32, v32) in write_back:
                for stored, computed in ((target, t32), (state["exp_avg"], m32),
                                         (state["exp_avg_sq"], v32)):
                    if stored is not computed:
                        stored.copy_(computed)
                if target is not param:
                    param.copy_(target)
        return loss


def _fp32(tensor):
    return tensor if tensor.dtype == FP32 else tensor.float()
