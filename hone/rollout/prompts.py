"""Prompt tokenisation (the order prompts are drawn in is `hone.data.schedulers`)."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase
from transformers.processing_utils import ProcessorMixin

from hone.data.images import load_image
from hone.errors import HoneError
from hone.models.chat import chat_ids, chat_text
from hone.models.vision import encode_images, image_placeholders
from hone.rollout.episodes import EpisodeKind, SingleTurn
from hone.types import Sample, VisionInputs

# verl's and LLaVA's marker for where an image goes in a plain-text prompt.
IMAGE_MARKER = "<image>"


class ImagePromptError(HoneError, ValueError):
    """A sample's images cannot be placed in its prompt (one line, naming the sample)."""


def chat_messages(
    sample: Sample, chat_template: bool, system_prompt: str | None
) -> list[dict[str, Any]] | None:
    """The messages to render through the chat template, or None for a plain-text prompt. A
    `system_prompt` (`data.system_prompt`) opens the chat unless the sample's messages bring their own.
    A plain prompt with images becomes one user message of parts: each `<image>` marker in its text an
    image, or (no marker) every image before the text."""
    if not (chat_template or sample.messages is not None):
        if sample.images:
            raise ImagePromptError(
                f"sample {sample.id!r} has images but data.chat_template is false: a vision-language model "
                "places images through its chat template"
            )
        return None
    messages = sample.messages or [{"role": "user", "content": _prompt_content(sample)}]
    if system_prompt is not None and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def _prompt_content(sample: Sample) -> str | list[dict[str, Any]]:
    text = sample.prompt or ""
    if not sample.images:
        return text
    if IMAGE_MARKER not in text:
        return [*({"type": "image"} for _ in sample.images), {"type": "text", "text": text}]
    pieces = text.split(IMAGE_MARKER)
    if len(pieces) - 1 != len(sample.images):
        raise ImagePromptError(
            f"sample {sample.id!r}: its prompt has {len(pieces) - 1} {IMAGE_MARKER} markers for "
            f"{len(sample.images)} images"
        )
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(pieces):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def encode_prompt(
    sample: Sample,
    tokenizer: PreTrainedTokenizerBase,
    chat_template: bool,
    system_prompt: str | None = None,
    processor: ProcessorMixin | None = None,
) -> tuple[list[int], VisionInputs | None]:
    """Token ids of a sample's prompt: plain text as is, or chat messages through the chat template; and
    its images' vision inputs (through `processor`, which also expands each image's placeholder)."""
    messages = chat_messages(sample, chat_template, system_prompt)
    if messages is None:
        # Special tokens as the tokenizer adds them by default (BOS for Llama-style models), as SFT does.
        return tokenizer(sample.prompt or "")["input_ids"], None
    if not sample.images:
        return chat_ids(tokenizer, messages, add_generation_prompt=True), None
    if processor is None:
        raise ImagePromptError(
            f"sample {sample.id!r} has images but the model is text-only (it has no processor)"
        )
    text = chat_text(tokenizer, messages, add_generation_prompt=True)
    placeholders = image_placeholders(processor, text)
    if placeholders != len(sample.images):
        raise ImagePromptError(
            f"sample {sample.id!r}: its rendered prompt has {placeholders} image placeholders for "
            f"{len(sample.images)} images"
        )
    images = [load_image(image, f"sample {sample.id!r} image {k}") for k, image in enumerate(sample.images)]
    return encode_images(processor, text, images)


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
    processor: ProcessorMixin | None = None,
) -> EpisodeKind:
    """How a run plays its samples, in training and in eval alike: the agent's episodes (`rollout.agent`),
    one environment episode per rollout (`env.name`), or single-turn generation of the encoded prompt."""
    return (
        agent
        or episodes
        or SingleTurn(lambda s: encode_prompt(s, tokenizer, chat_template, system_prompt, processor))
    )
