"""Upstream behaviour that changed between releases, as named version ranges.

A feature asks ``session.upstream(fact)`` (or registers a record with ``fixed_upstream(fact)``)
instead of comparing version numbers itself. A fact's range may be open (">=0.17": from 0.17 on):
it says what upstream does, not what the layer was verified on.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .ranges import Range

#: fact -> (the releases where it holds, what it means)
FACTS: Dict[str, Tuple[str, str]] = {
    "te_version_without_te": (
        ">=0.17", "is_te_min_version answers False without TransformerEngine (fixed in 0.17.0)"),
    "remove_sharded_tensors_without_writer_metadata_path": (
        ">=0.17", "remove_sharded_tensors no longer reads FileSystemWriter.metadata_path "
                  "(fixed in 0.17.0)"),
    "moe_utils_defines_te_names": (
        ">=0.17", "moe_utils defines te_general_gemm and the fused permute names as None "
                  "without TE (fixed in 0.17.0)"),
    "mla_knows_te_is_missing": (
        ">=0.17", "multi_latent_attention reads HAVE_TE from the TE extension (fixed in 0.17.0)"),
    "experts_split_unlike_dense_reduced_over_expert_dp": (
        ">=0.19", "expert weights split unlike the dense layers are reduced over the "
                  "expert-data-parallel group (fixed in 0.19.0)"),
    "legacy_checkpoint_saves_every_shard": (
        ">=0.19", "--ckpt-format torch is written by a rank of every (tp, ep) shard (fixed in "
                  "0.19.0)"),
    "local_spec_has_grouped_mlp": (
        "<0.17", "the local spec builds GroupedMLP for --moe-grouped-gemm (removed in 0.17)"),
    "mla_normalises_query_input_without_q_lora": (
        ">=0.19", "MLA with --qk-layernorm and no --q-lora-rank normalises the query "
                  "projection's input (a fused norm+linear, QKNormConfigResolver; new in 0.19)"),
    "hf_tokenizer_fast_by_default": (
        ">=0.17", "HuggingFaceTokenizer is fast unless --tokenizer-hf-no-use-fast (0.16: slow "
                  "unless --tokenizer-hf-use-fast)"),
    "hf_tokenizer_special_tokens_by_default": (
        ">=0.17", "HuggingFaceTokenizer includes special tokens unless "
                  "--tokenizer-hf-no-include-special-tokens (0.16: only with "
                  "--tokenizer-hf-include-special-tokens)"),
}


def holds(fact: str, version) -> bool:
    """Whether ``fact`` holds for the Megatron ``version`` (False when it is unknown)."""
    return version is not None and version in Range.parse(FACTS[fact][0])


def since(fact: str) -> str:
    """The release from which ``fact`` holds (a fact of one open range, ">=X")."""
    spec = FACTS[fact][0]
    if not spec.startswith(">=") or "," in spec:
        raise ValueError(f"fact {fact!r} does not start at one release ({spec})")
    return spec[2:]


def fixed_upstream(fact: str, since: str) -> Tuple[str, str]:
    """For the record of a fix that upstream made later: its range, from ``since`` (the oldest
    release it was verified on) to the release where the fact starts to hold, and its ``ends``
    note (why ``mmp doctor`` shows it skipped from there on)."""
    spec, meaning = FACTS[fact]
    if not spec.startswith(">=") or "," in spec:
        raise ValueError(f"fact {fact!r} is not an upstream fix ({spec})")
    return f">={since},<{spec[2:]}", f"not needed: {meaning}"


def meaning(fact: str) -> Optional[str]:
    return FACTS.get(fact, (None, None))[1]
