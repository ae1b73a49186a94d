"""The kinds of config field a family's table is made of. A field knows both directions: the
Megatron flags its value means (import), the value a checkpoint's args give it (export, when
there is no config to take), and the values Megatron cannot build, refused with the reason.

A config field that no field of the model type's table names is refused (``Family.check``):
it could change the network without the conversion knowing. ``BOOKKEEPING`` fields say how a
checkpoint was saved or is run, not what it computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from ..errors import ConversionError

BOOKKEEPING = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
    "initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "tokenizer_class",
    "output_router_logits", "use_return_dict", "torchscript", "tie_encoder_decoder",
    "pruned_heads", "add_cross_attention", "cross_attention_hidden_size", "finetuning_task",
    "task_specific_params", "prefix", "sep_token_id", "decoder_start_token_id",
    "max_length", "bad_words_ids", "num_labels",
    # which remote-code classes trust_remote_code would load (the DeepSeek and Kimi hub configs)
    "auto_map",
})

_UNWRITTEN = object()


@dataclass(frozen=True)
class Field:
    """``name``: the config key. ``flags(config)``: the Megatron flags it means (called whether
    or not the config holds it, so a default is a flag too). ``from_args(args)``: the value the
    export writes (a field without it is not written). ``allowed``: the values
    Megatron builds (a tuple, or a predicate; None: any), refused with ``why`` otherwise."""

    name: str
    flags: Optional[Callable[[dict], List[str]]] = None
    from_args: Optional[Callable[[Any], Any]] = None
    allowed: Any = None
    why: str = ""

    def check(self, config: dict) -> None:
        if self.allowed is None:
            return
        value = config.get(self.name)
        ok = value in self.allowed if isinstance(self.allowed, (tuple, list, frozenset, set)) \
            else self.allowed(value)
        if not ok:
            raise ConversionError(f"config.json: {self.name}={value!r} is not supported: "
                                  f"{self.why}. Nothing was written.")


def sized(name: str, flag: str, attribute: str, default: Callable[[dict], Any] = None) -> Field:
    """An integer field that is one Megatron flag and one of the args' attributes."""

    def flags(config: dict) -> List[str]:
        value = config.get(name)
        if value is None:
            if default is None:
                raise ConversionError(f"config.json has no {name}, which the model's shape "
                                      f"needs. Nothing was written.")
            value = default(config)
        return [flag, str(int(value))]

    return Field(name, flags, lambda args: getattr(args, attribute))


def fixed(name: str, allowed, why: str, written=_UNWRITTEN) -> Field:
    """A field whose only values are those Megatron's layers compute (no flag); the export
    writes ``written``."""
    return Field(name, allowed=allowed, why=why,
                 from_args=None if written is _UNWRITTEN else (lambda args: written))


def understood(*names: str) -> List[Field]:
    """Fields that change nothing the conversion builds (run-time or training settings)."""
    return [Field(name) for name in names]


def flags_of(fields, config: dict) -> List[str]:
    out: List[str] = []
    for field in fields:
        if field.flags is not None:
            out += field.flags(config)
    return out


def check_fields(config: dict, model_type: str, fields) -> None:
    names = {f.name for f in fields}
    unknown = sorted(set(config) - names - BOOKKEEPING)
    if unknown:
        raise ConversionError(
            f"config.json ({model_type}) has fields this conversion does not know: "
            f"{', '.join(unknown)}. They may change the network, so nothing was written. If "
            f"they do not (metadata of a newer transformers), remove them from a copy of the "
            f"directory; otherwise this model needs a mapping of its own.")
    for field in fields:
        field.check(config)


def config_of(fields, args) -> dict:
    return {field.name: field.from_args(args) for field in fields
            if field.from_args is not None}
