"""upstream_fixes.optimizer_lr_unset: without Apex/TE, megatron-core builds its optimizer from an
OptimizerConfig whose lr is unset (None), as it does with TE's FusedAdam, and keeps that None."""

import pytest

from tests.conftest import printed_lines, run_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import PRELUDE, apex_or_te_installed

#: one gloo rank, a one-linear MegatronModule in DDP, the optimizer built from the config's
#: defaults (upstream's checkpointing tests do this), then a step before any lr is set
PROBE = PRELUDE + """
config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1)
model = DistributedDataParallel(config, DistributedDataParallelConfig(), Tiny(config))
for kind, lr in (("adam", None), ("sgd", None), ("adam", 0.25)):
    optimizer_config = OptimizerConfig(optimizer=kind, lr=lr)
    inner = get_megatron_optimizer(optimizer_config, [model]).optimizer
    print("built", kind, optimizer_config.lr, [g["lr"] for g in inner.param_groups],
          inner.defaults["lr"])
for p in inner.param_groups[0]["params"]:
    p.grad = torch.ones_like(p)
inner.param_groups[0]["lr"] = None
try:
    inner.step()
    print("step ran")
except TypeError:
    print("step refused")
"""


pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: megatron-core uses FusedAdam")



def test_the_optimizer_builds_with_lr_unset_and_keeps_it_unset(tmp_path):
    proc = run_on_one_cpu_rank(PROBE, tmp_path)
    built = printed_lines(proc, ("built",))
    assert built == ["built adam None [None, None] None", "built sgd None [None, None] None",
                     "built adam 0.25 [0.25, 0.25] 0.25"]
    # as with FusedAdam, a step before the scheduler sets the learning rate fails
    assert proc.stdout.splitlines()[-1] == "step refused"


def test_without_the_fix_the_torch_fallback_refuses_lr_unset(tmp_path):
    proc = run_on_one_cpu_rank(PROBE, tmp_path,
                               MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.optimizer_lr_unset")
    assert proc.returncode != 0
    assert "TypeError: '<=' not supported between instances of 'float' and 'NoneType'" \
        in proc.stderr, proc.stderr[-3000:]
