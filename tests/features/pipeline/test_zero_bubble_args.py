"""``--enable-zero-bubble`` and MT-Megatron's ``ENABLE_ZERO_BUBBLE=1``: what switches it on and
what it refuses (docs/bad_inputs.md rows 108-112), before Megatron validates."""

from types import SimpleNamespace

import pytest

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.settings import Settings
from megatron_musa_patch.features.pipeline import zero_bubble

from tests.harness.sessions import make_session


def margs(**kw):
    base = dict(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=None,
                num_layers_per_virtual_pipeline_stage=None, gradient_accumulation_fusion=True,
                use_megatron_fsdp=False, enable_zero_bubble=True)
    base.update(kw)
    return SimpleNamespace(**base)


def validate(args, env=()):
    session = make_session(zero_bubble, settings=Settings(mt_env=tuple(env)))
    zero_bubble.mmp_validate_args(args=args, session=session)
    return args


@pytest.mark.parametrize("change,says", [
    (dict(pipeline_model_parallel_size=1),
     "there is none at --pipeline-model-parallel-size 1: add --pipeline-model-parallel-size 2"),
    (dict(num_layers_per_virtual_pipeline_stage=2),
     "with virtual pipeline stages the interleaved schedule runs: drop "
     "--num-layers-per-virtual-pipeline-stage"),
    (dict(gradient_accumulation_fusion=False),
     "main_grad, which is --gradient-accumulation-fusion: drop --no-gradient-accumulation-fusion"),
    (dict(use_megatron_fsdp=True), "Megatron-FSDP builds each main_grad in place"),
])
def test_what_zb_h1_cannot_run_with_is_refused_naming_the_flag(change, says):
    with pytest.raises(ArgumentError) as err:
        validate(margs(**change))
    assert "--enable-zero-bubble: " in str(err.value) and says in " ".join(str(err.value).split())


def test_the_mt_switch_sets_the_flag_and_is_named_in_its_refusals():
    assert validate(margs(enable_zero_bubble=False),
                    env=[("ENABLE_ZERO_BUBBLE", "1")]).enable_zero_bubble is True
    assert validate(margs(enable_zero_bubble=False),
                    env=[("ENABLE_ZERO_BUBBLE", "0")]).enable_zero_bubble is False
    with pytest.raises(ArgumentError, match=r"^ENABLE_ZERO_BUBBLE=1: .*drop "
                                            r"--no-gradient-accumulation-fusion"):
        validate(margs(enable_zero_bubble=False, gradient_accumulation_fusion=False),
                 env=[("ENABLE_ZERO_BUBBLE", "1")])


def test_the_mt_switch_without_a_pipeline_changes_nothing_and_says_so_once(capsys):
    session = make_session(zero_bubble, settings=Settings(mt_env=(("ENABLE_ZERO_BUBBLE", "1"),)))
    for _ in range(2):  # Megatron validates the arguments more than once
        args = margs(enable_zero_bubble=False, pipeline_model_parallel_size=1)
        zero_bubble.mmp_validate_args(args=args, session=session)
        assert args.enable_zero_bubble is False
    assert capsys.readouterr().err.count("ENABLE_ZERO_BUBBLE=1: no pipeline parallelism here") == 1


def test_without_the_flag_nothing_is_checked():
    assert validate(margs(enable_zero_bubble=False, pipeline_model_parallel_size=1,
                          gradient_accumulation_fusion=False)).enable_zero_bubble is False


def test_a_timeline_without_a_pipeline_is_refused():
    from megatron_musa_patch.features.pipeline import timeline

    with pytest.raises(ArgumentError, match="--pipeline-timeline out: records the pipeline "
                                            "schedule's operations, and there is no pipeline"):
        timeline.mmp_validate_args(args=SimpleNamespace(pipeline_timeline="out",
                                                        pipeline_model_parallel_size=1))
    timeline.mmp_validate_args(args=SimpleNamespace(pipeline_timeline="out",
                                                    pipeline_model_parallel_size=2))
