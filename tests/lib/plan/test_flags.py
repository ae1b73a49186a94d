"""Editing a training command line: levers and layouts paste back as the user's own flags."""

from megatron_musa_patch.lib.plan import flags, layouts, levers

ARGS = ["--num-layers", "8", "--tensor-model-parallel-size", "2", "--bf16",
        "--recompute-activations", "--data-path", "a", "0.5", "b"]


def test_split_keeps_multi_valued_flags():
    assert dict(flags.split(ARGS))["--data-path"] == ["a", "0.5", "b"]


def test_edit_sets_replaces_and_removes():
    out = flags.edited(ARGS, {"--tensor-model-parallel-size": "4", "--sequence-parallel": None},
                       remove=["--bf16"])
    assert flags.value(out, "--tensor-model-parallel-size") == "4"
    assert flags.has(out, "--sequence-parallel") and not flags.has(out, "--bf16")
    assert dict(flags.split(out))["--data-path"] == ["a", "0.5", "b"]
    assert flags.difference(ARGS, out) == ["--tensor-model-parallel-size", "4",
                                           "--sequence-parallel", "(without --bf16)"]


def test_recompute_modes_replace_each_other():
    full = levers.with_recompute(ARGS, "full")
    assert levers.recompute_mode(full) == "full"
    assert not flags.has(full, "--recompute-activations")
    ours = levers.with_recompute(full, "ours")
    assert levers.recompute_mode(ours) == "ours"
    assert not flags.has(ours, "--recompute-granularity")
    assert levers.recompute_mode(levers.with_recompute(ours, "none")) == "none"


def test_layouts_respect_the_model_shape():
    args = ["--num-layers", "4", "--num-attention-heads", "8", "--seq-length", "256",
            "--global-batch-size", "16", "--micro-batch-size", "2"]
    found = {layouts.name(x) for x in layouts.candidates(args, 2, 2)}
    assert found == {"tp1 pp1 dp2", "tp2 pp1 dp1", "tp1 pp2 dp1", "tp1 pp2 vpp2 dp1"}
    odd = ["--num-layers", "3", "--num-attention-heads", "3", "--seq-length", "256",
           "--global-batch-size", "16", "--micro-batch-size", "2"]
    assert {layouts.name(x) for x in layouts.candidates(odd, 2, 2)} == {"tp1 pp1 dp2"}
    applied = layouts.apply(args, {"tp": 2, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "dp": 1,
                                   "layers_per_chunk": 4})
    assert flags.value(applied, "--tensor-model-parallel-size") == "2"
    assert flags.has(applied, "--sequence-parallel")


def test_memory_levers_offer_each_remedy_once():
    args = ["--micro-batch-size", "4", "--use-distributed-optimizer"]
    whys = [lever.why for lever in levers.for_memory(args, {"dp": 2, "micro_batch_size": 4})]
    # flash attention, ours, full, offload, halve the micro-batch
    assert len(whys) == len(set(whys)) == 5
    with_flash = [*args, "--use-flash-attn"]
    assert not any("flash" in lever.why
                   for lever in levers.for_memory(with_flash, {"dp": 2, "micro_batch_size": 4}))
    speed = levers.for_speed(["--num-layers", "8"], {"pp": 2, "vpp": 1}, 0.3, 8)
    assert flags.value(speed[0].args, "--num-layers-per-virtual-pipeline-stage") == "2"
