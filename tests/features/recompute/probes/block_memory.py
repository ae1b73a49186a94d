"""Bytes held for backward per block of a megatron-core layer, per recompute setting, on one CPU
rank (tests/features/recompute/test_megatron_core.py's memory tests). Prints one
``RESULT {json}`` line."""

import json

import megatron_musa_patch  # noqa: F401 - activates before Megatron is imported

from tests.features.recompute import recompute_layer as rl  # noqa: E402


def main():
    rl.init_single_rank()
    dense = rl.Shape()
    moe = rl.Shape(experts=4, shared_expert=96, ffn=128)
    overlap = rl.Shape(experts=4, shared_expert=96, ffn=128, shared_overlap=True)
    grouped = rl.Shape(experts=4, shared_expert=96, ffn=128, grouped=True)
    out = {"dense": {k: rl.block_bytes(dense, k) for k in rl.SETTINGS},
           "moe": {k: rl.block_bytes(moe, k) for k in ("none", "variance", "mlp",
                                                       "mlp+variance", "mlp_rms")},
           "moe_overlap": {k: rl.block_bytes(overlap, k) for k in ("none", "mlp")},
           "moe_grouped": {k: rl.block_bytes(grouped, k) for k in ("none", "mlp",
                                                                   "mlp+variance")},
           "norm_output": dense.seq * dense.batch * dense.hidden * 4, "hidden": dense.hidden}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
