"""One rank of the attention / MoE fusion checks (run under torchrun by
tests/features/test_fusions.py).

Trains the harness's tiny megatron-core GPT (tests/harness/tiny_gpt.py: local spec, fp32, dropout
off) once per run, in one process: every run of a family starts from the same weights and sees the
same batches.

* dense (DP2): ``unfused`` (upstream's local attention) vs ``flash``
  (``config.use_flash_attn = True``, set the megatron-core way); ``flash+dropout`` only has to
  train (SDPA's dropout pattern is not nn.Dropout's).
* MoE (4 experts, top-2, EP2): ``moe`` (SequentialMLP, non-fused permute) vs ``moe+permute``
  (``moe_permute_fusion``) and ``moe+permute+gg`` (``moe_grouped_gemm``: the local spec's
  GroupedMLP, its weights converted from the SequentialMLP ones), with the alltoall and the
  allgather dispatcher.
* MLA (query/key head dim 24, value head dim 16, through the same local DotProductAttention):
  ``mla`` vs ``mla+flash``.
"""

from __future__ import annotations

import argparse
import functools
import json
import re

from tests.harness import tiny_gpt  # activates the layer before Megatron is imported

import torch  # noqa: E402

#: run -> (family, settings)
RUNS = {
    "unfused": ("dense", {}),
    "flash": ("dense", {"flash": True}),
    "flash+dropout": ("dense", {"flash": True, "attention_dropout": 0.2}),
    "mla": ("mla", {}),
    "mla+flash": ("mla", {"flash": True}),
    "moe": ("moe", {}),
    "moe+permute": ("moe", {"moe_permute_fusion": True}),
    "moe+permute+gg": ("moe", {"moe_permute_fusion": True, "moe_grouped_gemm": True}),
    "moe-allgather": ("moe-allgather", {}),
    "moe-allgather+permute+gg": ("moe-allgather", {"moe_permute_fusion": True,
                                                    "moe_grouped_gemm": True}),
}
FAMILY_OPTIONS = {"dense": {}, "mla": {"mla": True}, "moe": {"experts": 4, "ep": 2},
                  "moe-allgather": {"experts": 4, "ep": 2, "dispatcher": "allgather"}}


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seq", type=int, default=30, help="not a multiple of 8 on purpose")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def build(family, settings, opts):
    """The harness's model with the run's config settings (and spec, for grouped GEMM)."""
    from megatron.core.models.gpt import gpt_layer_specs

    model_opts = tiny_gpt.options(**FAMILY_OPTIONS[family], steps=opts.steps, seq=opts.seq,
                                  layers=2)
    extra = {k: v for k, v in settings.items() if k.startswith("moe_")}
    real_spec = gpt_layer_specs.get_gpt_layer_local_spec
    if extra.get("moe_grouped_gemm"):
        gpt_layer_specs.get_gpt_layer_local_spec = functools.partial(real_spec,
                                                                     moe_grouped_gemm=True)
    try:
        tiny_gpt.seed(1234)
        model, config = tiny_gpt.build_model(model_opts, True, True, **extra)
    finally:
        gpt_layer_specs.get_gpt_layer_local_spec = real_spec
    config.use_flash_attn = bool(settings.get("flash"))
    if settings.get("attention_dropout"):
        for module in model.modules():
            if type(module).__name__ == "DotProductAttention":
                module.attention_dropout.p = settings["attention_dropout"]
    return model, config, model_opts


_EXPERT = re.compile(r"(.*\.experts\.)local_experts\.(\d+)\.(linear_fc[12])\.weight$")


def grouped_state(sequential_state, model):
    """SequentialMLP weights as GroupedMLP's weight1 [h, E*f1] / weight2 [E*f2, h] (the layout
    its sharded_state_dict maps to SequentialMLP's)."""
    state = {k: v for k, v in sequential_state.items() if not _EXPERT.match(k)}
    experts = {}
    for key, value in sequential_state.items():
        found = _EXPERT.match(key)
        if found:
            prefix, index, which = found.groups()
            experts.setdefault((prefix, which), {})[int(index)] = value
    for (prefix, which), by_index in experts.items():
        # GroupedMLP views weight1 as [E, h, f1] and weight2 as [E, f2, h] (plain reshapes)
        blocks = torch.stack([by_index[i].t() for i in sorted(by_index)])
        name = "weight1" if which == "linear_fc1" else "weight2"
        state[prefix + name] = blocks.reshape(-1, blocks.shape[-1]) if name == "weight2" else \
            blocks.reshape(blocks.shape[1], -1)
    own = model.state_dict()
    return {k: v for k, v in state.items() if k in own}


def train(model, config, model_opts):
    models, optimizer = tiny_gpt.wrap([model.to("cuda")], config)
    return tiny_gpt.train_steps(models, optimizer, tiny_gpt.rank_batches(model_opts),
                                model_opts)[0]


def count_calls():
    """Count the calls of the ops the features route to (proof the fused paths ran)."""
    from megatron_musa_patch.lib.ops import attention, grouped_gemm, moe_permute

    counts = {}
    for module, name in ((attention, "sdpa_attention"), (moe_permute, "permute"),
                         (moe_permute, "unpermute"), (moe_permute, "sort_chunks_by_index"),
                         (grouped_gemm, "gmm")):
        original = getattr(module, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*args, **kwargs)

        setattr(module, name, counted)
    return counts


def main(argv=None):
    opts = parse(argv)
    counts = count_calls()
    tiny_gpt.init_parallel(tiny_gpt.options(ep=2))  # the device's backend (gloo on CPU)
    initial, results = {}, {}
    for name in opts.runs.split(","):
        family, settings = RUNS[name]
        model, config, model_opts = build(family, settings, opts)
        if family not in initial:
            initial[family] = {k: v.detach().clone() for k, v in model.state_dict().items()
                               if torch.is_tensor(v)}
        elif settings.get("moe_grouped_gemm") and any(type(m).__name__ == "GroupedMLP"
                                                       for m in model.modules()):
            # 0.16's local spec builds GroupedMLP; from 0.17 (GroupedMLP removed) SequentialMLP
            loaded = model.load_state_dict(grouped_state(initial[family], model), strict=False)
            missing = [k for k in loaded.missing_keys if not k.endswith("_extra_state")]
            assert not missing and not loaded.unexpected_keys, (missing, loaded.unexpected_keys)
        else:
            model.load_state_dict(initial[family], strict=False)
        kinds = sorted({type(m).__name__ for m in model.modules()
                        if type(m).__name__ in ("SequentialMLP", "GroupedMLP")})
        counts.clear()
        results[name] = {"losses": train(model, config, model_opts), "experts": kinds,
                         "calls": dict(counts)}
    if torch.distributed.get_rank() == 0:
        with open(opts.out, "w") as f:
            json.dump({"results": results}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
