"""What ``mmp checkpoint`` does in its own process before a Megatron step: it reads the Hugging
Face directory's config and tensor names and plans, without importing torch (seconds its
worker, which builds the model, pays anyway)."""

from megatron_musa_patch.checkpoint.families import rows as tensor_rows
from megatron_musa_patch.device import rows

from tests.checkpoint.test_refusals import LLAMA, hf_dir
from tests.conftest import run_probe, subprocess_env


def test_import_hf_plans_without_importing_torch(tmp_path):
    source = hf_dir(tmp_path, LLAMA)
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "gpt_builders.py").write_text("")
    proc = run_probe("tests.checkpoint.probes.plan_import", source, tmp_path / "out",
                     env=subprocess_env(MEGATRON_LM_PATH=str(tmp_path / "lm")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the row is the device table's CPU row, whose name the command writes without importing it
    assert proc.stdout.strip() == \
        f"step fill on 1 rank(s), row {rows.CPU.name}; torch imported: False", proc.stdout


def test_the_layouts_still_compute_with_torch_imported_where_used():
    import torch

    gate, up = torch.arange(6.0).reshape(3, 2), -torch.arange(6.0).reshape(3, 2)
    gated = tensor_rows.Gated("fc1", "gate", "up")
    assert torch.equal(gated.to_megatron([gate, up], {}), torch.cat([gate, up]))
    back = gated.to_hf(gated.to_megatron([gate, up], {}), {})
    assert torch.equal(back[0], gate) and torch.equal(back[1], up)
    q, k, v = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2, 3)
    dims = {"heads": 2, "groups": 1, "head_dim": 2}
    qkv = tensor_rows.GroupedQKV("qkv", "q", "k", "v")
    assert [torch.equal(a, b) for a, b in
            zip(qkv.to_hf(qkv.to_megatron([q, k, v], dims), dims), (q, k, v))] \
        == [True, True, True]
