"""``--pipeline-v-schedule``: what it refuses (docs/bad_inputs.md rows 113-118) before Megatron
validates, and the placement records on their own: the layer offset, the last virtual stage, the
model builders' ``post_process``, the batch fields of rank 0."""

from types import SimpleNamespace

import pytest

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.features.pipeline import v_schedule
from megatron_musa_patch.lib.pipeline.run import RUN_KEY, PipelineRun

from tests.harness.sessions import make_session


def margs(**kw):
    base = dict(pipeline_v_schedule="zb-v", pipeline_model_parallel_size=4, num_layers=16,
                virtual_pipeline_model_parallel_size=None,
                num_virtual_stages_per_pipeline_rank=2,
                num_layers_per_virtual_pipeline_stage=None,
                untie_embeddings_and_output_weights=True, enable_zero_bubble=False,
                gradient_accumulation_fusion=True, tensor_model_parallel_size=1)
    base.update(kw)
    return SimpleNamespace(**base)


def validate(args):
    session = make_session(v_schedule)
    v_schedule.mmp_validate_args(args=args, session=session)
    return session.state_for(RUN_KEY, PipelineRun)


@pytest.mark.parametrize("change,says", [
    (dict(pipeline_model_parallel_size=1),
     "a V needs a pipeline, and --pipeline-model-parallel-size is 1: set it to 2 or more."),
    (dict(num_virtual_stages_per_pipeline_rank=None),
     "the V is two model chunks per rank: add --num-virtual-stages-per-pipeline-rank 2"),
    (dict(num_virtual_stages_per_pipeline_rank=4), "the V is two model chunks per rank"),
    (dict(untie_embeddings_and_output_weights=False),
     "tying them across chunks is not supported: add --untie-embeddings-and-output-weights."),
    (dict(enable_zero_bubble=True), "--enable-zero-bubble is ZB-H1"),
    (dict(gradient_accumulation_fusion=False), "drop --no-gradient-accumulation-fusion."),
    (dict(mtp_num_layers=1, decoder_first_pipeline_num_layers=3),
     "not with --mtp-num-layers, --decoder-first-pipeline-num-layers (the V places the layers "
     "evenly"),
    (dict(use_megatron_fsdp=True), "not with --use-megatron-fsdp"),
])
def test_what_the_v_cannot_run_with_is_refused_naming_the_flag(change, says):
    with pytest.raises(ArgumentError) as err:
        validate(margs(**change))
    message = " ".join(str(err.value).split())
    assert message.startswith("--pipeline-v-schedule zb-v: ") and says in message, message


@pytest.mark.parametrize("flags", [
    dict(num_virtual_stages_per_pipeline_rank=2),
    dict(num_virtual_stages_per_pipeline_rank=None, num_layers_per_virtual_pipeline_stage=2),
    dict(num_virtual_stages_per_pipeline_rank=None, virtual_pipeline_model_parallel_size=2),
])
def test_two_chunks_per_rank_by_any_of_megatrons_flags_is_taken(flags):
    assert validate(margs(**flags)).v_schedule == "zb-v"


def test_without_the_flag_nothing_is_checked_or_switched():
    assert validate(margs(pipeline_v_schedule=None, pipeline_model_parallel_size=1)) \
        .v_schedule is None


# ----------------------------------------------------------------------------- placement


class FakeState:
    def __init__(self, rank, ranks=4, vp_size=2, vp_rank=None):
        self.rank, self.ranks, self.vp_size, self.vp_rank = rank, ranks, vp_size, vp_rank

    def get_pipeline_model_parallel_rank(self):
        return self.rank

    def get_pipeline_model_parallel_world_size(self):
        return self.ranks

    def get_virtual_pipeline_model_parallel_world_size(self):
        return self.vp_size

    def get_virtual_pipeline_model_parallel_rank(self):
        return self.vp_rank


@pytest.fixture
def state(monkeypatch):
    import megatron.core
    from megatron.core import parallel_state  # noqa: F401 - the attribute patched below

    fake = FakeState(rank=0)
    monkeypatch.setattr(megatron.core, "parallel_state", fake)
    return fake


def interleaved_offset(config, vp_stage=None, pp_rank=None):
    """upstream's even interleaved placement: chunk v of rank r is stage v*p + r"""
    return (vp_stage * config.pipeline_model_parallel_size + pp_rank) * config.layers_per_stage


def test_chunk_1_of_rank_r_takes_the_layers_of_stage_2p_minus_1_minus_r(state):
    run = PipelineRun(v_schedule="zb-v")
    config = SimpleNamespace(pipeline_v_schedule="zb-v", pipeline_model_parallel_size=4,
                             layers_per_stage=3)
    stages = {(r, v): v_schedule._layer_offset(run, interleaved_offset, None, (config,),
                                               dict(vp_stage=v, pp_rank=r)) // 3
              for r in range(4) for v in (0, 1)}
    assert stages == {(r, 0): r for r in range(4)} | {(r, 1): 7 - r for r in range(4)}
    state.rank = 2  # pp_rank from parallel_state when not given
    assert v_schedule._layer_offset(run, interleaved_offset, None, (config,),
                                    dict(vp_stage=1)) == 5 * 3
    config.pipeline_v_schedule = None
    assert v_schedule._layer_offset(run, interleaved_offset, None, (config,),
                                    dict(vp_stage=1, pp_rank=2)) == 6 * 3


def upstream_is_last(ignore_virtual=True, vp_stage=None):
    return "upstream"


def test_the_last_virtual_stage_is_rank_0s_chunk_1(state):
    run = PipelineRun(v_schedule="zb-v")
    last = {}
    for rank in range(4):
        state.rank = rank
        for vp in (0, 1):
            last[(rank, vp)] = v_schedule._last_stage(run, upstream_is_last, None, (),
                                                      dict(ignore_virtual=False, vp_stage=vp))
    assert [k for k, v in last.items() if v] == [(0, 1)]
    # "the last pipeline rank", and everything without the V, is upstream's answer
    assert v_schedule._last_stage(run, upstream_is_last, None, (), {}) == "upstream"
    assert v_schedule._last_stage(PipelineRun(), upstream_is_last, None, (),
                                  dict(ignore_virtual=False, vp_stage=1)) == "upstream"


def test_the_model_builders_put_the_loss_on_rank_0s_chunk_1_and_rank_0_reads_labels(state):
    run = PipelineRun(v_schedule="zb-v")
    built = []

    def provider(pre_process=True, post_process=True, vp_stage=None, config=None):
        built.append((vp_stage, post_process))

    def get_model(model_provider_func, model_type=None):
        for vp in (0, 1):
            model_provider_func(pre_process=vp == 0, post_process=False, vp_stage=vp)

    for rank in (0, 3):
        state.rank = rank
        v_schedule._get_model(run, get_model, None, (provider,), {})
    assert built == [(0, False), (1, True), (0, False), (1, False)]

    def get_batch_on_this_tp_rank(data_iterator, mtp_on_this_rank=False):
        return mtp_on_this_rank

    state.rank = 0
    assert v_schedule._batch(run, get_batch_on_this_tp_rank, None, (None,), {}) is True
    state.rank = 1
    assert v_schedule._batch(run, get_batch_on_this_tp_rank, None, (None,), {}) is False


def test_dualpipev_with_fewer_micro_batches_than_stages_is_refused_at_the_first_step(state):
    state.get_pipeline_model_parallel_group = lambda: SimpleNamespace(size=lambda: 4,
                                                                      rank=lambda: 0)
    with pytest.raises(ArgumentError) as err:
        v_schedule._run_v(PipelineRun(v_schedule="dualpipev"), "dualpipev", SimpleNamespace(),
                          dict(model=[], num_microbatches=6))
    assert " ".join(str(err.value).split()) == (
        "--pipeline-v-schedule dualpipev: 6 micro-batches per step, and dualpipev needs at "
        "least 8 at --pipeline-model-parallel-size 4 (one per stage): raise "
        "--global-batch-size or lower --micro-batch-size.")
