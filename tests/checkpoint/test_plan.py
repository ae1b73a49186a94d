"""The parallel layout and the plan file of a conversion (``checkpoint/plan.py``), and how a step
is handed its plan (``checkpoint/conversion.py``, ``run_step``). In-process, no Megatron needed."""

import dataclasses
from types import SimpleNamespace

import pytest

from megatron_musa_patch.checkpoint import cli, conversion, processes
from megatron_musa_patch.checkpoint.errors import ConversionError
from megatron_musa_patch.checkpoint.plan import Layout, Plan


def options(*layout):
    return cli.parser().parse_args(["import-hf", "--hf-dir", "in", "--save", "out", *layout])


def test_the_layout_asked_for_is_the_one_saved_args_give_back():
    asked = Layout.from_options(options("--tensor-model-parallel-size", "2",
                                        "--pipeline-model-parallel-size", "4"))
    saved = Layout.from_args(SimpleNamespace(tensor_model_parallel_size=2,
                                             pipeline_model_parallel_size=4,
                                             expert_model_parallel_size=None))
    assert asked == saved == Layout(tp=2, pp=4, ep=1)
    assert (asked.ranks, str(asked)) == (8, "TP2 PP4 EP1")
    assert asked.flags() == ["--tensor-model-parallel-size", "2",
                             "--pipeline-model-parallel-size", "4",
                             "--expert-model-parallel-size", "1"]
    # args saved without an expert size at all: one expert rank
    assert Layout.from_args(SimpleNamespace(tensor_model_parallel_size=1,
                                            pipeline_model_parallel_size=1)) == Layout()
    assert Layout.from_options(options()) == Layout() and Layout().ranks == 1


def test_a_size_below_one_is_refused_naming_it():
    with pytest.raises(ConversionError, match=r"not \{'pp': 0, 'ep': -1\}"):
        Layout.from_options(options("--pipeline-model-parallel-size", "0",
                                    "--expert-model-parallel-size", "-1"))


@pytest.mark.parametrize("plan", [
    Plan(hf_dir="/models/llama", save_format="torch"),
    Plan(hf_config={"architectures": ["LlamaForCausalLM"], "rope_scaling": {"factor": 8.0}},
         hf_out="/out", side_files=("/ref/tokenizer.json", "/ref/generation_config.json"),
         dtype="bfloat16", max_shard_bytes=4 << 30),
    Plan(),
])
def test_the_plan_file_reads_back_as_written(tmp_path, plan):
    path = tmp_path / "plan.json"
    plan.write(path)
    assert Plan.read(path) == plan


def test_a_step_reads_the_plan_written_for_it(tmp_path, monkeypatch):
    seen = []

    def run(cmd, env=None):
        path = cmd[cmd.index("--plan") + 1]
        seen.append((cmd[cmd.index("--mode") + 1], Plan.read(path), cmd[cmd.index("--") + 1:]))
        return 0 if len(seen) == 1 else 3

    monkeypatch.setattr(processes, "run", run)
    plan = Plan(hf_dir="/models/llama")
    saving = dataclasses.replace(plan, save_format="torch")
    conversion.run_step("reshard", 2, saving, tmp_path, ["--bf16"], tmp_path)
    with pytest.raises(conversion.StepFailed) as failed:
        conversion.run_step("fill", 1, plan, tmp_path, ["--fp16"], tmp_path)
    assert seen == [("reshard", saving, ["--bf16"]), ("fill", plan, ["--fp16"])]
    assert str(failed.value) == ("mmp checkpoint: error: the fill step on 1 rank(s) failed (exit "
                                 "3); its processes were stopped and what it wrote removed: "
                                 "nothing was written (see its output above).")


def test_a_failed_step_ends_the_command_with_its_message(monkeypatch):
    def fail(*args):
        raise conversion.StepFailed("mmp checkpoint: error: the dump step failed")

    monkeypatch.setattr(conversion, "export_hf", fail)
    with pytest.raises(SystemExit) as raised:
        cli.main(["export-hf", "--load", "ckpt", "--hf-dir", "hf"])
    assert raised.value.code == "mmp checkpoint: error: the dump step failed"
