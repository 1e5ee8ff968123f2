"""Chat-template rendering with the result's shape settled in one place.

`apply_chat_template` is annotated as returning any of its shapes (text, ids, a batch of either, a
`BatchEncoding`), and transformers 5 returns a `BatchEncoding` where 4.x returned a plain id list. Callers
want one conversation as text or as ids: `chat_text` and `chat_ids` give exactly that, or raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from transformers import BatchEncoding, PreTrainedTokenizerBase


def _tools(tools: Sequence[dict] | None) -> list[dict | Callable[..., Any]] | None:
    return None if tools is None else list(tools)


def chat_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    *,
    tools: Sequence[dict] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """One conversation rendered by the tokenizer's chat template, as text."""
    text = tokenizer.apply_chat_template(
        messages, tools=_tools(tools), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned a {type(text).__name__}, not a str")
    return text


def chat_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    *,
    tools: Sequence[dict] | None = None,
    add_generation_prompt: bool = False,
) -> list[int]:
    """One conversation rendered by the tokenizer's chat template, as token ids."""
    out = tokenizer.apply_chat_template(
        messages, tools=_tools(tools), tokenize=True, add_generation_prompt=add_generation_prompt
    )
    ids = out["input_ids"] if isinstance(out, BatchEncoding) else out  # transformers 5 / 4.x
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise TypeError(f"apply_chat_template(tokenize=True) returned no id list: {type(out).__name__}")
    return cast("list[int]", ids)  # checked just above
