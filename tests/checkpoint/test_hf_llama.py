"""mmp checkpoint on the Llama family, the whole way (needs MEGATRON_LM_PATH).

CI: import at TP2 (the checkpoint's args read without megatron-core are the ones megatron-core
reads); the first iteration of stock pretrain_gpt.py --finetune logs transformers' loss on the
same tokens; export gives back the original bit for bit. Outside CI (the whole stock
suite): a few training steps saved by stock pretrain_gpt.py, exported to a model whose
transformers loss on the next batch is the loss Megatron logs for it (resumed from that same
checkpoint)."""

import pytest

from tests.checkpoint import tiny_models
from tests.checkpoint.hf_steps import (assert_args_read_alone, assert_bitwise, batches,
                                       first_losses, hf_loss_of, import_hf, mmp, stock, tensors)

pytestmark = pytest.mark.stock

TP2 = ["--tensor-model-parallel-size", "2"]


@pytest.mark.ci
def test_llama_import_finetune_export(lm_path, tmp_path):
    hf = tiny_models.make("llama", tmp_path)
    imported = import_hf(hf, tmp_path / "imported", TP2, "torch_dist", lm_path)
    flags = (imported / "model_flags.txt").read_text()
    assert "--transformer-impl local" in flags and "--untie-embeddings-and-output-weights" in flags
    assert_args_read_alone(imported)
    megatron, expected = first_losses(imported, hf, TP2, tmp_path / "first", lm_path)
    assert megatron == pytest.approx(expected, rel=1e-5), (megatron, expected)
    exported = tmp_path / "exported"
    mmp("export-hf", "--load", str(imported), "--hf-dir", str(exported), lm_path=lm_path)
    assert_bitwise(tensors(hf), tensors(exported))


def test_llama_trained_by_pretrain_gpt_exports_what_it_trained(lm_path, tmp_path):
    hf = tiny_models.make("llama", tmp_path)
    imported = import_hf(hf, tmp_path / "imported", TP2, "torch_dist", lm_path)
    # train 2 of 3 steps from it (the schedule of 3), saved by stock pretrain_gpt.py; resume for
    # the third, whose logged loss is computed with the saved weights on a batch the probe saw
    trained = tmp_path / "trained"
    stock(imported, TP2, tmp_path / "train", lm_path,
          ["--load", str(imported), "--finetune", "--no-load-optim", "--no-load-rng",
           "--save", str(trained), "--save-interval", "2", "--exit-interval", "2"], iters=3)
    losses, _ = stock(imported, TP2, tmp_path / "resume", lm_path,  # its model flags
                      ["--load", str(trained)], iters=3)
    after = tmp_path / "after"
    mmp("export-hf", "--load", str(trained), "--hf-dir", str(after), lm_path=lm_path)
    third = batches(tmp_path / "resume", 3)
    assert losses[3] == pytest.approx(hf_loss_of(after, third), rel=1e-5)
    assert losses[3] != pytest.approx(hf_loss_of(hf, third), rel=1e-4)  # the steps changed it
