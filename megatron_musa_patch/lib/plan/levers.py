"""The flags that would change a plan that does not fit or idles: each a named edit of the user's
own command line; the planner plans each one again, so its effect is predicted, not guessed."""

from __future__ import annotations

import dataclasses
from typing import List, Sequence

from . import flags

RECOMPUTE_OURS = {"--attn-recompute": None, "--mlp-recompute": None, "--recompute-variance": None}
RECOMPUTE_FULL = {"--recompute-granularity": "full", "--recompute-method": "uniform",
                  "--recompute-num-layers": "1"}
RECOMPUTE_FLAGS = ("--recompute-activations", "--recompute-granularity", "--recompute-method",
                   "--recompute-num-layers", *RECOMPUTE_OURS)
#: a stage's idle share above which the pipeline's levers are offered
BUBBLE_WORTH_A_LEVER = 0.15


@dataclasses.dataclass(frozen=True)
class Lever:
    why: str
    args: List[str]


def recompute_mode(args: Sequence[str]) -> str:
    if flags.value(args, "--recompute-granularity") == "full":
        return "full"
    if all(flags.has(args, f) for f in RECOMPUTE_OURS):
        return "ours"
    if flags.has(args, "--recompute-activations") or \
            flags.value(args, "--recompute-granularity") == "selective":
        return "selective"
    return "none"


def with_recompute(args: Sequence[str], mode: str) -> List[str]:
    plain = flags.edited(args, remove=RECOMPUTE_FLAGS)
    if mode == "ours":
        return flags.edited(plain, RECOMPUTE_OURS)
    if mode == "selective":
        return flags.edited(plain, {"--recompute-activations": None})
    if mode == "full":
        return flags.edited(plain, RECOMPUTE_FULL)
    return plain


def for_memory(args: Sequence[str], layout: dict) -> List[Lever]:
    out: List[Lever] = []
    if layout.get("dp", 1) > 1 and not flags.has(args, "--use-distributed-optimizer"):
        out.append(Lever("shard the optimizer's state over the data-parallel ranks",
                         flags.edited(args, {"--use-distributed-optimizer": None})))
    mode = recompute_mode(args)
    if not flags.has(args, "--use-flash-attn") and mode != "full":
        out.append(Lever("flash attention on the local spec (the layer's "
                         "fused_ops.flash_attention): no sequence x sequence scores are stored",
                         flags.edited(args, {"--use-flash-attn": None})))
    if mode in ("none", "selective"):
        out.append(Lever("recompute attention and MLP inputs and the norms' variance "
                         "(this layer's recompute)", with_recompute(args, "ours")))
    if mode != "full":
        out.append(Lever("recompute each layer whole in the backward pass (upstream's full "
                         "recompute)", with_recompute(args, "full")))
    if flags.has(args, "--use-distributed-optimizer") and \
            not flags.has(args, "--optimizer-cpu-offload"):
        out.append(Lever("keep the optimizer's state and step on the host",
                         flags.edited(args, {"--optimizer-cpu-offload": None,
                                             "--optimizer-offload-fraction": "1.0",
                                             "--use-precision-aware-optimizer": None})))
    mbs = int(layout.get("micro_batch_size", 1))
    if mbs > 1:
        out.append(Lever("halve the micro-batch (more micro-batches per step)",
                         flags.edited(args, {"--micro-batch-size": str(mbs // 2)})))
    return out


def for_speed(args: Sequence[str], layout: dict, bubble: float, num_layers: int) -> List[Lever]:
    out: List[Lever] = []
    pp = layout.get("pp", 1)
    if pp > 1 and layout.get("vpp", 1) == 1 and bubble > BUBBLE_WORTH_A_LEVER and \
            num_layers % (pp * 2) == 0:
        out.append(Lever("interleave two model chunks per stage (the bubble shrinks by half)",
                         flags.edited(args, {"--num-layers-per-virtual-pipeline-stage":
                                             str(num_layers // (pp * 2))})))
    if recompute_mode(args) != "none":
        out.append(Lever("recompute nothing (faster, if it fits)",
                         with_recompute(args, "none")))
    return out
