"""The one error of ``mmp checkpoint``: a model or checkpoint it cannot convert, said in one
paragraph that names the culprit (architecture, config field, file) and what to do."""

from megatron_musa_patch.base.errors import MegatronMusaPatchError


class ConversionError(MegatronMusaPatchError):
    """A Hugging Face model or a Megatron checkpoint this command cannot convert."""
