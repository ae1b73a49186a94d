"""upstream_fixes.vision_norm_without_te: CLIPViTModel builds from the local spec without TE, its
norms follow config.normalization, and a forward pass runs."""

import pytest

from megatron_musa_patch.upstream.conditions import te_installed

from tests.conftest import printed_lines, run_on_one_cpu_rank

PROBE = """
import sys
import megatron_musa_patch
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.vision.clip_vit_model import CLIPViTModel
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
parallel_state.initialize_model_parallel()
model_parallel_cuda_manual_seed(1)
for normalization in ("LayerNorm", "RMSNorm"):
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4,
                               normalization=normalization)
    model = CLIPViTModel(config, get_gpt_layer_local_spec(normalization=normalization),
                         img_h=28, img_w=28, patch_dim=14)
    out = model(torch.randn(2, 3, 28, 28))
    print("built", normalization, type(model.ln_pre).__name__, tuple(out.shape))
"""


pytestmark = pytest.mark.skipif(te_installed(), reason="TE is installed: TENorm is the default")



def test_clip_vit_builds_and_runs_without_te(tmp_path):
    built = printed_lines(run_on_one_cpu_rank(PROBE, tmp_path), ("built",))
    # 4 patches of 14x14 plus the class token, batch 2, hidden 64
    assert built == ["built LayerNorm LayerNorm (2, 5, 64)", "built RMSNorm RMSNorm (2, 5, 64)"]


def test_without_the_fix_upstream_cannot_build_its_default_norm(tmp_path):
    proc = run_on_one_cpu_rank(PROBE, tmp_path,
                               MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.vision_norm_without_te")
    assert proc.returncode != 0
    assert "unexpected keyword argument 'config'" in proc.stderr, proc.stderr[-3000:]
