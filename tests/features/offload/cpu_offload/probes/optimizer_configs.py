"""megatron-core's OptimizerConfig with the precision-aware / CPU-offload settings, through the
activated layer (no TransformerEngine): prints ``RESULT{json}``, each case accepted (with the
resulting flags) or refused (with the message), and the status of the feature's patches.

Run by tests/features/offload/cpu_offload/test_flags.py."""

import json

import torch
import megatron_musa_patch

from megatron.core.optimizer import OptimizerConfig
from megatron_musa_patch.base.errors import ArgumentError

CASES = {
    "aware": dict(use_precision_aware_optimizer=True),
    "aware-bf16-moments": dict(use_precision_aware_optimizer=True, bf16=True,
                               exp_avg_dtype=torch.bfloat16, exp_avg_sq_dtype=torch.bfloat16),
    "aware-fp16-sq": dict(use_precision_aware_optimizer=True, exp_avg_sq_dtype=torch.float16),
    "offload-zero": dict(use_precision_aware_optimizer=True, optimizer_cpu_offload=True),
    "offload-half": dict(use_precision_aware_optimizer=True, optimizer_cpu_offload=True,
                         optimizer_offload_fraction=0.5),
}


def main():
    out = {}
    for name, kw in CASES.items():
        try:
            c = OptimizerConfig(optimizer="adam", use_distributed_optimizer=True, **kw)
            out[name] = ["ok", c.optimizer_cpu_offload,
                         c.use_precision_aware_optimizer_no_fp8_or_ds_fp8]
        except ArgumentError as e:
            out[name] = ["refused", str(e)]
    registry = megatron_musa_patch.active_session().registry
    out["patches"] = {r.id: r.status for r in registry.results() if r.feature == "offload.cpu_offload"}
    print("RESULT" + json.dumps(out))


if __name__ == "__main__":
    main()
