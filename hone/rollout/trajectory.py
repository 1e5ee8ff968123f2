"""The one token-exact trajectory builder every episode records its model calls with.

A trajectory is one token sequence: a prompt, then sampled tokens (kept *exactly as sampled*, never
re-tokenised from text: `loss_mask` 1, the sampler's log-probs) and the tokens the conversation added
between two samples (observations, tool results, the template's markup: `loss_mask` 0, log-prob 0).
verl and AReaL call the alternative's mismatch "re-tokenisation drift".

What the tokens between two samples are has two answers, both here, because they are what two kinds of
episode can know:
* `ObservationRenderer`: an environment episode knows the new messages; their ids are the chat
  template's *difference* between a conversation with and without them (on a fixed stand-in), plus the
  template's closing of the assistant message (see its docstring).
* `Trajectory.text` (`extend_text`): an agent program behind the HTTP endpoint sends its whole
  conversation each time; a rendering that extends, as text, what the trajectory decodes to adds only
  the tokens of the new text.
Plain message dicts only: this module knows no environment.

Images (a vision-language model): a message's content may be a list of parts in the HF processor's chat
format, `{"type": "image", "image": <PIL image | bytes | path>}` beside `{"type": "text", "text": ...}`
(an OpenAI `{"type": "image_url", "image_url": {"url": "data:..."}}` part is read too). The template
renders each image part as the model's placeholder, which the model's processor expands to the image's
tokens (`hone.models.vision.encode_images`); the trajectory accumulates every image's `VisionInputs` in
placeholder order (`Trajectory.vision`), sent with every later request and kept by the rollout. The
conversation is recorded with bare `{"type": "image"}` parts (the pixels live in `vision` only). A model
without a processor given an image raises `ImageObservationError` (one line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

from transformers import PreTrainedTokenizerBase

from hone.data.images import load_image, take_images
from hone.errors import HoneError
from hone.models.chat import chat_ids, chat_text
from hone.models.vision import encode_images, image_placeholders
from hone.types import Rollout, VisionInputs

if TYPE_CHECKING:
    from transformers.processing_utils import ProcessorMixin

Message = dict[str, Any]


class ImageObservationError(HoneError, ValueError):
    """Images a conversation holds cannot reach the model: it is text-only (no processor), or the chat
    template did not place them (one line, naming the sample and turn)."""


@dataclass
class Completion:
    """One sampled model call: the exact prompt ids the sampler saw, its tokens and log-probs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str  # the sampled tokens decoded (special tokens skipped): what an assistant turn is rendered as
    finish_reason: str
    policy_version: int
    token_versions: list[int] = field(default_factory=list)  # per token, where versions changed mid-call


@dataclass
class Trajectory:
    """One token sequence of an episode: a prompt, then sampled tokens (mask 1) and the tokens the
    conversation added between completions (mask 0)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per response token: the version that sampled it
    turns: list[tuple[int, int]] = field(default_factory=list)  # each completion's span of response_ids
    completions: list[Completion] = field(default_factory=list)
    text: str = ""  # the whole context decoded with special tokens (`extend_text` keeps it)
    vision: VisionInputs | None = None  # every image of the context, in the order of their placeholders

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_completion(self, completion: Completion) -> None:
        """Append sampled tokens: trained on."""
        start = len(self.response_ids)
        self.response_ids += completion.completion_ids
        self.loss_mask += [1] * len(completion.completion_ids)
        self.logprobs += completion.logprobs
        n = len(completion.completion_ids)
        self.versions += completion.token_versions or [completion.policy_version] * n
        self.turns.append((start, len(self.response_ids)))
        self.completions.append(completion)

    def add_context(self, ids: list[int], vision: VisionInputs | None = None) -> None:
        """Append tokens the conversation added (observations, markup): in the context, not trained on;
        `vision`, the images whose (expanded) placeholders `ids` hold."""
        self.vision = VisionInputs.join(self.vision, vision)
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [self.versions[-1] if self.versions else 0] * len(ids)  # not trained on

    def decode_text(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Refresh `text`, what a later full rendering must start with to extend this sequence."""
        self.text = cast(str, tokenizer.decode(self.context, skip_special_tokens=False))

    def to_rollout(self, sample_id: str, group_id: int, **fields: Any) -> Rollout:
        """The sequence as a `Rollout`; `fields` are the rest (response_text, finish_reason, metrics...)."""
        # The one invariant training relies on: exactly the sampled tokens are trained on.
        sampled = sum(len(c.completion_ids) for c in self.completions)
        assert sum(self.loss_mask) == sampled and len(self.loss_mask) == len(self.response_ids)
        return Rollout(
            sample_id=sample_id,
            group_id=group_id,
            token_ids=self.context,
            prompt_len=len(self.prompt_ids),
            loss_mask=list(self.loss_mask),
            sampler_logprobs=list(self.logprobs),
            turns=list(self.turns),
            token_versions=list(self.versions) if len(set(self.versions)) > 1 else [],
            vision=self.vision,
            **fields,
        )


def completion_of(out: Rollout, prompt_ids: list[int], tokenizer: PreTrainedTokenizerBase) -> Completion:
    """A sampler's output as a `Completion` (its text decoded without special tokens)."""
    return Completion(
        prompt_ids=prompt_ids,
        completion_ids=list(out.response_ids),
        logprobs=list(out.sampler_logprobs),
        text=cast(str, tokenizer.decode(out.response_ids, skip_special_tokens=True)),
        finish_reason=out.finish_reason,
        policy_version=out.policy_version,
        token_versions=list(out.token_versions),
    )


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict] | None
) -> list[int]:
    """Prompt ids of a conversation through the chat template, with the generation prompt."""
    return chat_ids(tokenizer, messages, tools=tools, add_generation_prompt=True)


def render_opening(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict] | None,
    processor: ProcessorMixin | None = None,
    images: list[Any] | None = None,
    where: str = "the opening messages",
) -> tuple[list[int], list[Message], VisionInputs | None]:
    """An episode's prompt: its ids, its messages as recorded (image parts bare), and its images' inputs.
    `images` (a sample's) fill the bare `{"type": "image"}` placeholders in order; where every image part
    carries its own image they are not used, and a sample's images with no image part at all is an error."""
    parts = [p for m in messages if isinstance(m.get("content"), list) for p in m["content"]]
    parts = [p for p in parts if isinstance(p, dict) and p.get("type") in ("image", "image_url")]
    own = all(p.get("type") == "image_url" or p.get("image", p.get("path")) is not None for p in parts)
    bare, refs = take_images(messages, where, () if parts and own else images or ())
    if not refs:
        return render_prompt(tokenizer, bare, tools), bare, None
    text = chat_text(tokenizer, bare, tools=tools, add_generation_prompt=True)
    ids, vision = encode_images(*_images_for(processor, text, refs, where))
    return ids, bare, vision


def _images_for(
    processor: ProcessorMixin | None, text: str, refs: list[Any], where: str
) -> tuple[ProcessorMixin, str, list[Any]]:
    """The processor, text and decoded images to encode; `ImageObservationError` when they cannot be."""
    if processor is None:
        raise ImageObservationError(
            f"{where} hold(s) {len(refs)} image(s) but the model is text-only (it has no processor): "
            "images need a vision-language model (e.g. Qwen2.5-VL)"
        )
    placed = image_placeholders(processor, text)
    if placed != len(refs):
        raise ImageObservationError(
            f"{where}: the chat template placed {placed} image placeholder(s) for {len(refs)} image(s) "
            "(does it render image parts in this role?)"
        )
    return processor, text, [load_image(ref, f"{where} image {k}") for k, ref in enumerate(refs)]


class ObservationRenderer:
    """Token ids the chat template puts between a sampled assistant turn and the next one.

    The *difference* between a rendered conversation with and without the new messages (on a fixed
    two-message stand-in, so templates that rewrite earlier turns, e.g. dropping reasoning, can't shift
    it), plus the template's closing of an assistant message (e.g. Qwen's "<|im_end|>\\n"). A turn that
    stopped on an eos already holds its end-of-turn token, the one the model sampled: the closing's
    leading end-of-turn token is then dropped, whichever eos was sampled, and only the rest of the closing
    (Qwen's "\\n") follows. A turn cut off by a limit gets the whole closing."""

    _MARK = "hone-stand-in-reply"
    _STAND_IN: ClassVar[list[Message]] = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": _MARK},
    ]

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_ids: frozenset[int],
        processor: ProcessorMixin | None = None,
    ) -> None:
        self.tokenizer, self.processor = tokenizer, processor
        # What can open a closing as its end-of-turn token: an id the sampler stops on, or a special token
        # (a template's marker such as <|im_end|>, even where the generation config stops on another eos).
        special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self.end_ids = frozenset(eos_ids) | special | set(tokenizer.all_special_ids)
        # Environments repeat themselves ("wrong", "higher") and a template render costs more than a
        # model's decode step on a tiny model: remember each distinct observation's ids for this renderer.
        self._seen: dict[str, list[int]] = {}

    def __call__(
        self, observation: list[Message], *, ended_with_eos: bool, tools: list[dict] | None
    ) -> list[int]:
        """The ids of a text observation (`observe` takes one with images)."""
        ids, _, vision = self.observe(observation, ended_with_eos=ended_with_eos, tools=tools)
        if vision is not None:
            raise ImageObservationError("an observation with images has pixels as well as ids: use observe()")
        return ids

    def observe(
        self,
        observation: list[Message],
        *,
        ended_with_eos: bool,
        tools: list[dict] | None,
        where: str = "an observation",
    ) -> tuple[list[int], list[Message], VisionInputs | None]:
        """The observation's ids (images expanded by the processor), its messages as recorded (image
        parts bare) and its images' inputs (None without images)."""
        bare, refs = take_images(observation, where)
        if refs:  # pixels are not remembered: each image observation goes through the processor
            closing, piece = self._piece(bare, tools)
            ids, vision = encode_images(
                *_images_for(self.processor, piece, refs, where), add_special_tokens=False
            )
            return self._drop_opening(ids, closing, ended_with_eos), bare, vision
        key = repr((bare, ended_with_eos, tools))
        if key not in self._seen:
            closing, piece = self._piece(bare, tools)
            ids = self.tokenizer.encode(piece, add_special_tokens=False)
            self._seen[key] = self._drop_opening(ids, closing, ended_with_eos)
        return list(self._seen[key]), bare, None

    def _piece(self, observation: list[Message], tools: list[dict] | None) -> tuple[str, str]:
        """The template's closing of an assistant message, and the text from it through the new messages'
        generation prompt."""
        before = self._render(self._STAND_IN, tools, generation_prompt=False)
        after = self._render(self._STAND_IN + observation, tools, generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "the chat template rewrites earlier turns when messages are added; cannot splice"
            )
        # What follows the assistant content, e.g. "<|im_end|>\n". A turn that stopped on an eos has
        # ended with the token the model sampled: the closing's own end-of-turn token, if it opens with
        # one, is not added again (a token, not a text prefix: "<" must not eat the start of "<eos>").
        closing = before[before.rindex(self._MARK) + len(self._MARK) :]
        return closing, closing + after[len(before) :]

    def _drop_opening(self, ids: list[int], closing: str, ended_with_eos: bool) -> list[int]:
        opening = self.tokenizer.encode(closing, add_special_tokens=False)[:1]
        if ended_with_eos and opening and ids[:1] == opening and opening[0] in self.end_ids:
            return ids[1:]
        return ids

    def _render(self, messages: list[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        return chat_text(self.tokenizer, messages, tools=tools, add_generation_prompt=generation_prompt)
