"""Prompt tokenisation (the order prompts are drawn in is `hone.data.schedulers`)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from hone.data.schedulers import PromptStream as PromptStream  # re-exported: moved to hone.data
from hone.models.chat import chat_ids, chat_text
from hone.rollout.episodes import EpisodeKind, SingleTurn
from hone.types import Sample


def chat_messages(
    sample: Sample, chat_template: bool, system_prompt: str | None
) -> list[dict[str, str]] | None:
    """The messages to render through the chat template, or None for a plain-text prompt. A
    `system_prompt` (`data.system_prompt`) opens the chat unless the sample's messages bring their own."""
    if not (chat_template or sample.messages is not None):
        return None
    messages = sample.messages or [{"role": "user", "content": sample.prompt or ""}]
    if system_prompt is not None and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def encode_prompt(
    sample: Sample, tokenizer: PreTrainedTokenizerBase, chat_template: bool, system_prompt: str | None = None
) -> list[int]:
    """Token ids of a sample's prompt: plain text as is, or chat messages through the chat template."""
    messages = chat_messages(sample, chat_template, system_prompt)
    if messages is not None:
        return chat_ids(tokenizer, messages, add_generation_prompt=True)
    # Special tokens as the tokenizer adds them by default (BOS for Llama-style models), as SFT does.
    return tokenizer(sample.prompt or "")["input_ids"]


def render_prompt(
    sample: Sample, tokenizer: PreTrainedTokenizerBase, chat_template: bool, system_prompt: str | None = None
) -> str:
    """The prompt as text, exactly as `encode_prompt` sees it (for SFT, which tokenises text)."""
    messages = chat_messages(sample, chat_template, system_prompt)
    if messages is not None:
        return chat_text(tokenizer, messages, add_generation_prompt=True)
    return sample.prompt or ""


def episode_kind(
    agent: EpisodeKind | None,
    episodes: EpisodeKind | None,
    tokenizer: PreTrainedTokenizerBase,
    chat_template: bool,
    system_prompt: str | None,
) -> EpisodeKind:
    """How a run plays its samples, in training and in eval alike: the agent's episodes (`rollout.agent`),
    one environment episode per rollout (`env.name`), or single-turn generation of the encoded prompt."""
    return (
        agent or episodes or SingleTurn(lambda s: encode_prompt(s, tokenizer, chat_template, system_prompt))
    )
