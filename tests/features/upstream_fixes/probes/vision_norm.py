"""One gloo rank (file store ``sys.argv[1]``): CLIPViTModel built from the local spec with
LayerNorm and with RMSNorm, and a forward pass of each. Prints ``built <normalization> <class
of ln_pre> <output shape>``.

Run by tests/features/upstream_fixes/test_vision_norm.py."""

import sys

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.vision.clip_vit_model import CLIPViTModel
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig


def main(store):
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1)
    for normalization in ("LayerNorm", "RMSNorm"):
        config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4,
                                   normalization=normalization)
        model = CLIPViTModel(config, get_gpt_layer_local_spec(normalization=normalization),
                             img_h=28, img_w=28, patch_dim=14)
        out = model(torch.randn(2, 3, 28, 28))
        print("built", normalization, type(model.ln_pre).__name__, tuple(out.shape))


if __name__ == "__main__":
    main(sys.argv[1])
