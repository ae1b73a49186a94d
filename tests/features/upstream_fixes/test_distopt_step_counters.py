"""upstream_fixes.distopt_step_counters: without Apex/TE, the distributed optimizer's state dict
reads a per-parameter ``step`` that torch's Adam creates only at its first step. Moments filled
before any step (upstream's ``init_state_fn``, and its checkpointing tests, set only
``exp_avg``/``exp_avg_sq``) are at step 0; the live state is left as it was."""

import pytest

from tests.conftest import run_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import PRELUDE, apex_or_te_installed

#: a two-linear Tiny in DDP under the distributed optimizer: its state
#: dict with no state, with moments filled as upstream's tests fill them, and after a step with
#: one parameter's state refilled with moments only
PROBE = PRELUDE + """
def steps(optimizer, when):
    try:
        groups = optimizer.state_dict()["optimizer"]["param_groups"]
    except (AssertionError, KeyError) as error:
        print(when, "refused", type(error).__name__, error)
        return
    live = [sorted(s) for s in optimizer.optimizer.state.values()]
    print(when, [g["step"] for g in groups], live)


config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1)
ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
model = DistributedDataParallel(config, ddp_config, Tiny(config, layers=2))
optimizer = get_megatron_optimizer(
    OptimizerConfig(optimizer="adam", lr=0.1, use_distributed_optimizer=True), [model])
inner = optimizer.optimizer
steps(optimizer, "empty")
first = inner.param_groups[0]["params"][0]
inner.state[first]["exp_avg"] = torch.rand_like(first)
inner.state[first]["exp_avg_sq"] = torch.rand_like(first)
steps(optimizer, "moments")
for p in model.parameters():
    p.main_grad.fill_(1.0)
inner.state.clear()
optimizer.step()
late = inner.state[inner.param_groups[-1]["params"][-1]]
late.clear()
late["exp_avg"] = torch.zeros(1)
steps(optimizer, "stepped")
"""


pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: the step is the param group's")


def test_moments_filled_before_any_step_are_at_step_0(tmp_path):
    proc = run_on_one_cpu_rank(PROBE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.split(" ")[0] in
             ("empty", "moments", "stepped")]
    assert lines == [
        "empty [0.0, 0.0] []",
        # the live state keeps only what the test put there: torch's Adam sees it as it was
        "moments [0.0, 0.0] [['exp_avg', 'exp_avg_sq']]",
        # after a step, a state without one takes the step the others share (step 0 would make
        # two steps, which upstream refuses)
        "stepped [1.0, 1.0] [['exp_avg', 'exp_avg_sq', 'step'], ['exp_avg', 'exp_avg_sq', 'step'],"
        " ['exp_avg', 'exp_avg_sq', 'step'], ['exp_avg']]",
    ], proc.stdout


def test_without_the_fix_a_state_dict_before_any_step_fails_bare(tmp_path):
    proc = run_on_one_cpu_rank(PROBE, tmp_path,
                               MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.distopt_step_counters")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.split(" ")[0] in
             ("empty", "moments", "stepped")]
    assert lines == ["empty refused AssertionError ", "moments refused KeyError 'step'",
                     "stepped refused KeyError 'step'"], proc.stdout
