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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from transformers import PreTrainedTokenizerBase

from hone.models.chat import chat_ids, chat_text
from hone.types import Rollout

Message = dict[str, Any]


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

    def add_context(self, ids: list[int]) -> None:
        """Append tokens the conversation added (observations, markup): in the context, not trained on."""
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

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
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
        key = repr((observation, ended_with_eos, tools))
        if key not in self._seen:
            self._seen[key] = self._ids(observation, ended_with_eos, tools)
        return list(self._seen[key])

    def _ids(self, observation: list[Message], ended_with_eos: bool, tools: list[dict] | None) -> list[int]:
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
        ids = self.tokenizer.encode(closing + after[len(before) :], add_special_tokens=False)
        opening = self.tokenizer.encode(closing, add_special_tokens=False)[:1]
        if ended_with_eos and opening and ids[:1] == opening and opening[0] in self.end_ids:
            return ids[1:]
        return ids

    def _render(self, messages: list[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        return chat_text(self.tokenizer, messages, tools=tools, add_generation_prompt=generation_prompt)
