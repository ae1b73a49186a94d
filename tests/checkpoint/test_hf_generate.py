"""Upstream's own greedy generation from an imported checkpoint equals transformers' (needs
MEGATRON_LM_PATH with upstream's examples/, and simpy, which upstream's example utilities import).

A tiny model of a family (random weights, with a tokenizer) is imported; stock
``examples/inference/.../gpt_static_inference.py`` runs through the layer on CPU ranks at a
parallel layout (TP2, PP2, EP2 for the MoE families), greedy (top_k 1), and the tokens it
generates for each prompt are those ``transformers``' ``generate(do_sample=False)`` generates
from the same prompt tokens."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.harness import stock as runner
from tests.checkpoint import tiny_models
from tests.checkpoint.hf_steps import import_hf, model_flags, ranks

pytestmark = pytest.mark.stock

PROMPTS = ("hello world", "the cat sat on", "Megatron")
NEW_TOKENS = 8
#: upstream's script, where each release keeps it
SCRIPTS = ("examples/inference/advanced/gpt_static_inference.py",  # 0.18+
           "examples/inference/gpt/gpt_static_inference.py")  # up to 0.17
CASES = {
    "qwen3-tp2": ("qwen3", ["--tensor-model-parallel-size", "2"], []),
    "qwen3-pp2": ("qwen3", ["--pipeline-model-parallel-size", "2"], []),
    "mixtral-ep2": ("mixtral", ["--expert-model-parallel-size", "2"], []),
    "deepseek_v3-ep2": ("deepseek_v3", ["--expert-model-parallel-size", "2"], []),
    # the full V2's best-expert group routing; V2-Lite's query without a norm (0.19)
    "deepseek_v2-ep2": ("deepseek_v2", ["--expert-model-parallel-size", "2"], []),
    "deepseek_v2_lite-ep2": ("deepseek_v2_lite", ["--expert-model-parallel-size", "2"], []),
    "qwen3_moe-ep2": ("qwen3_moe", ["--expert-model-parallel-size", "2"], []),
    "qwen2_moe-ep2": ("qwen2_moe", ["--expert-model-parallel-size", "2"], []),
    "phi3-tp2": ("phi3", ["--tensor-model-parallel-size", "2"], []),
    "phi4_mini-pp2": ("phi4_mini", ["--pipeline-model-parallel-size", "2"], []),
    "kimi_k2-ep2": ("kimi_k2", ["--expert-model-parallel-size", "2"], []),
}


def static_inference(lm_path: Path) -> Path:
    for relative in SCRIPTS:
        if (lm_path / relative).is_file():
            return lm_path / relative
    pytest.skip(f"MEGATRON_LM_PATH={lm_path} has no {' or '.join(SCRIPTS)}: the ../shared/upstream "
                f"archives leave examples/ out; point it at a full Megatron-LM checkout of the tag")


#: the model's vocabulary, all of it in the tokenizer (a tiny model generates from every row;
#: megatron-core 0.16 cannot detokenize an id its tokenizer lacks), a multiple of 8 so that no
#: padding rows are added at TP2
WORDS = 304


def tiny_with_tokenizer(family: str, root: Path) -> Path:
    hf = tiny_models.make(family, root, vocab_size=WORDS)
    tokenizer = tiny_models.tokenizer(WORDS)
    assert len(tokenizer) == WORDS
    tokenizer.save_pretrained(hf)  # replaces the smaller one some tiny models come with
    return hf


def transformers_greedy(hf: Path, prompts) -> list:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = tiny_models.reference(hf)
    tokenizer = AutoTokenizer.from_pretrained(str(hf), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    out = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            generated = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                       eos_token_id=None, pad_token_id=0)
        out.append(generated[0, ids.shape[1]:].tolist())
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_upstream_greedy_generation_matches_transformers(lm_path, tmp_path, case):
    pytest.importorskip("simpy", reason="upstream's examples/inference/utils.py imports simpy "
                                        "(pip install 'megatron-musa-patch[test]')")
    script = static_inference(lm_path)
    family, layout, extra = CASES[case]
    hf = tiny_with_tokenizer(family, tmp_path)
    imported = import_hf(hf, tmp_path / "imported", [], "torch_dist", lm_path)
    expected = dict(zip(PROMPTS, transformers_greedy(hf, PROMPTS)))
    # generation reads the tokenizer the checkpoint keeps: the source directory may go
    hf.rename(tmp_path / "source_gone")
    output = tmp_path / "generated.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_LM_PATH=str(lm_path), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [runner.mmp_executable(), "run", "--standalone",
         f"--nproc-per-node={ranks(layout)['nproc']}", str(script),
         *model_flags(imported), *layout, *extra, "--load", str(imported),
         "--micro-batch-size", "1", "--seq-length", "64", "--distributed-backend", "gloo",
         "--use-legacy-static-engine", "--prompts", *PROMPTS,
         "--num-tokens-to-generate", str(NEW_TOKENS), "--top_k", "1", "--temperature", "1.0",
         "--inference-max-seq-length", "64", "--output-path", str(output)],
        cwd=lm_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads(output.read_text())
    generated = {r["input_prompt"]: r["generated_tokens"] for r in results.values()}
    assert sorted(generated) == sorted(PROMPTS)
    eos = tiny_models.tokenizer(WORDS).eos_token_id
    for prompt in PROMPTS:
        ours, theirs = generated[prompt], expected[prompt]
        if len(ours) == NEW_TOKENS:
            assert ours == theirs, prompt
            continue
        # upstream stops at the end-of-document token (transformers here runs on): the same
        # tokens up to it, and transformers' next one is it
        ours = ours[:-1] if ours and ours[-1] == eos else ours
        assert ours == theirs[:len(ours)] and theirs[len(ours)] == eos, (prompt, ours, theirs)
