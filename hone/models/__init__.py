"""Model references and tiny offline models (see `resolve_model`, `build_tiny_model`)."""

from hone.models.resolve import TINY_PRESETS, resolve_model
from hone.models.tiny import EOS_TOKEN, PAD_TOKEN, build_byte_tokenizer, build_tiny_model

__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "TINY_PRESETS",
    "build_byte_tokenizer",
    "build_tiny_model",
    "resolve_model",
]
