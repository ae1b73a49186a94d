"""Mixtral: the dense family's attention with a top-k mixture of SwiGLU experts.

Hugging Face's router takes a softmax over every expert, keeps the top k and renormalises them;
Megatron's default router (top-k of the logits, then a softmax over those) gives the same
weights. Megatron's local spec holds the experts as ``mlp.experts.local_experts.<e>``."""

from __future__ import annotations

from typing import Callable, Iterator, List, Tuple

from . import common, dense

ARCHITECTURES = {"MixtralForCausalLM": "mixtral"}

FIELDS = {"mixtral": dense.FIELDS["mistral"] | {"num_local_experts", "num_experts_per_tok",
                                                 "router_aux_loss_coef", "router_jitter_noise"}}


def check(config: dict) -> None:
    common.check_fields(config, "mixtral", FIELDS["mixtral"])
    common.require(config, "hidden_act", ("silu",), "Mixtral's experts are silu-gated")
    common.require(config, "sliding_window", (None,),
                   "Megatron's local attention has no sliding window")
    common.require(config, "router_jitter_noise", (None, 0, 0.0),
                   "Megatron's router has no jitter noise")


def flags(config: dict) -> List[str]:
    out = dense.flags({**config, "model_type": "mistral"})
    out += ["--num-experts", str(int(config["num_local_experts"])),
            "--moe-router-topk", str(int(config["num_experts_per_tok"])),
            "--moe-router-load-balancing-type", "aux_loss",
            "--moe-aux-loss-coeff", repr(float(config.get("router_aux_loss_coef") or 0.0))]
    return out


def layer_to_megatron(config: dict, i: int, get: Callable) -> Iterator[Tuple[str, object]]:
    hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
    yield from dense.attention_to_megatron({**config, "model_type": "mistral"}, i, get)
    moe = hf + "block_sparse_moe."
    yield mg + "mlp.router.weight", get(moe + "gate.weight")
    for e in range(int(config["num_local_experts"])):
        expert = f"{moe}experts.{e}."
        out = f"{mg}mlp.experts.local_experts.{e}."
        yield out + "linear_fc1.weight", common.gated_to_megatron(get(expert + "w1.weight"),
                                                                  get(expert + "w3.weight"))
        yield out + "linear_fc2.weight", get(expert + "w2.weight")


def layer_to_hf(config: dict, i: int, get: Callable) -> Iterator[Tuple[str, object]]:
    hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
    yield from dense.attention_to_hf({**config, "model_type": "mistral"}, i, get)
    moe = hf + "block_sparse_moe."
    yield moe + "gate.weight", get(mg + "mlp.router.weight")
    for e in range(int(config["num_local_experts"])):
        source = f"{mg}mlp.experts.local_experts.{e}."
        gate, up = common.gated_from_megatron(get(source + "linear_fc1.weight"))
        yield f"{moe}experts.{e}.w1.weight", gate
        yield f"{moe}experts.{e}.w3.weight", up
        yield f"{moe}experts.{e}.w2.weight", get(source + "linear_fc2.weight")


def config_from_args(args, base: dict) -> dict:
    config = dense.config_from_args(args, base)
    for key in ("attention_bias", "mlp_bias"):
        config.pop(key, None)
    config.update({
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
        "num_local_experts": args.num_experts, "num_experts_per_tok": args.moe_router_topk,
        "router_aux_loss_coef": args.moe_aux_loss_coeff, "router_jitter_noise": 0.0,
        "sliding_window": None,
    })
    return config
