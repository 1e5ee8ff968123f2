"""Names that changed across transformers versions, asked of the model rather than of a version number."""

from __future__ import annotations

import inspect
from typing import Any

import torch


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward's keyword for a KV cache: transformers 5 renamed `past_key_values` to `cache`. An unknown
    name would be swallowed by **kwargs and silently disable the cache, so the signature is asked (of the
    model a PEFT wrapper wraps: its forward takes **kwargs and passes them on)."""
    get_base_model = getattr(model, "get_base_model", None)
    inner = get_base_model() if callable(get_base_model) else model
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned: transformers 5.2x renamed the output's `past_key_values` to `cache`
    (the old name still answers, with a deprecation warning at every call)."""
    fields = getattr(type(out), "__dataclass_fields__", {})
    return out.cache if "cache" in fields else out.past_key_values


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether activation (gradient) checkpointing is on; transformers 5 renamed the property."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or name in vars(model):
            return bool(getattr(model, name))
    return False
