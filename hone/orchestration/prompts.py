"""Prompt tokenisation and the deterministic order in which training prompts are drawn."""

from __future__ import annotations

import random
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from hone.rollout import GenerationRequest
from hone.types import Sample


def _chat(sample: Sample, chat_template: bool) -> list[dict[str, str]] | None:
    """The messages to render through the chat template, or None for a plain-text prompt."""
    if chat_template or sample.messages is not None:
        return sample.messages or [{"role": "user", "content": sample.prompt or ""}]
    return None


def encode_prompt(sample: Sample, tokenizer: PreTrainedTokenizerBase, chat_template: bool) -> list[int]:
    """Token ids of a sample's prompt: plain text as is, or chat messages through the chat template."""
    messages = _chat(sample, chat_template)
    if messages is not None:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        # transformers 5 returns a BatchEncoding here, 4.x a plain list.
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    # Special tokens as the tokenizer adds them by default (BOS for Llama-style models), as SFT does.
    return tokenizer(sample.prompt or "")["input_ids"]


def render_prompt(sample: Sample, tokenizer: PreTrainedTokenizerBase, chat_template: bool) -> str:
    """The prompt as text, exactly as `encode_prompt` sees it (for SFT, which tokenises text)."""
    messages = _chat(sample, chat_template)
    if messages is not None:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return sample.prompt or ""


def generation_requests(
    samples: Sequence[Sample], tokenizer: PreTrainedTokenizerBase, chat_template: bool
) -> list[GenerationRequest]:
    """One request per sample; its group id is the sample's index (the n rollouts of it share it)."""
    return [
        GenerationRequest(s.id, i, encode_prompt(s, tokenizer, chat_template)) for i, s in enumerate(samples)
    ]


class PromptStream:
    """Epochs over the training samples, each in a seeded shuffled order.

    `batch(step)` is a pure function of (seed, step): a resumed run draws exactly the prompts an
    uninterrupted run would, with no iterator state to save.
    """

    def __init__(self, samples: Sequence[Sample], batch_size: int, seed: int) -> None:
        if not samples:
            raise ValueError("no training samples")
        self.samples = list(samples)
        self.batch_size = batch_size
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.samples)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._orders = {epoch: order}  # only the current epoch is ever needed again
        return self._orders[epoch]

    def batch(self, step: int) -> list[Sample]:
        n = len(self.samples)
        start = step * self.batch_size
        return [self.samples[self._order(i // n)[i % n]] for i in range(start, start + self.batch_size)]
