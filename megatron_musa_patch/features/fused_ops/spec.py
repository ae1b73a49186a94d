"""Which layer spec Megatron-LM's arguments select."""


def local_spec(args) -> bool:
    """megatron-core's own layers (``--transformer-impl local``), no TransformerEngine."""
    return getattr(args, "transformer_impl", "transformer_engine") == "local"
