"""Token ids every side agrees on, whatever the tokenizer leaves undefined."""

from __future__ import annotations

from typing import Any


def pad_token_id(tokenizer: Any) -> int:
    """The id padded positions take: the tokenizer's pad token, else its eos. Many causal LMs define no
    pad token; a padded position is masked out of attention and loss, so any id the model embeds works,
    and eos is one it does (one rule for sampling, SFT, DPO and the RL batch, so they pad alike)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer defines neither a pad nor an eos token, so batches cannot be padded")
    return int(pad)
