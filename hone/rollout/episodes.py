"""Episodes: `async def episode(model, ...) -> EpisodeResult` (AReaL's `arun_episode`), and how a step's
episodes are played on one event loop.

Every way Hone produces a trajectory is a short coroutine over a `Model`: `single_turn` (one prompt's
group), `env_episode` (an `Environment` turn by turn), an agent program behind the HTTP endpoint
(`rollout.agent`, whose server calls `Model.chat`), and a verifiers environment (its seat calls the
model). Each model call goes through the one `Batcher` in front of `Sampler.generate` and is recorded by
the one token builder, `Trajectory`. `play` runs a step's episodes concurrently: a finished episode is
handed to `on_done` at once (the producer scores it there, so slow verifiers overlap sampling).

Which slot an episode's requests are batched in travels in a context variable (each episode is its own
task), so an episode function, or an environment's own code calling the model, needs no handle for it.

Environment episodes (`env_episode`) and their rules are in `hone.rollout.multiturn`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase
from transformers.processing_utils import ProcessorMixin

from hone.aio import run_serving
from hone.data.images import has_images
from hone.envs.base import EPISODE_WAITS
from hone.models.chat import chat_text
from hone.rollout.base import GenerationRequest, Sampler
from hone.rollout.batcher import Batcher
from hone.rollout.trajectory import (
    Completion,
    Message,
    Trajectory,
    completion_of,
    render_prompt,
)
from hone.types import Rollout, Sample, SamplingParams, VisionInputs

log = logging.getLogger("hone")
# Per-episode metric: 1 when the environment raised (in reset or step) and the episode ended there.
ENV_ERRORS = "env/errors"

_SLOT: contextvars.ContextVar[int] = contextvars.ContextVar("hone_episode_slot", default=-1)


class ChatTemplateError(ValueError):
    """The chat template cannot render a conversation `Model.chat` was given (the caller's error)."""


class Model:
    """What an episode samples through: the run's batcher, tokenizer and end-of-turn ids, and a
    vision-language model's `processor` (`Policy.processor`; None for a text model), which expands the
    images an environment episode's messages hold (`hone.rollout.multiturn`)."""

    def __init__(
        self, batcher: Batcher, tokenizer: PreTrainedTokenizerBase, processor: ProcessorMixin | None = None
    ) -> None:
        self.batcher, self.tokenizer, self.processor = batcher, tokenizer, processor
        self.eos_token_ids: frozenset[int] = batcher.sampler.eos_token_ids

    @property
    def policy_version(self) -> int:
        return self.batcher.sampler.policy_version

    async def generate(self, request: GenerationRequest, params: SamplingParams) -> list[Rollout]:
        """`params.n` rollouts of `request`, batched with the other episodes' requests."""
        return await self.batcher.generate(request, params, _SLOT.get())

    async def chat(
        self,
        segments: list[Trajectory],
        messages: list[Message],
        tools: list[dict] | None,
        params: SamplingParams,
        request_id: str = "",
    ) -> Completion:
        """One completion of the conversation `messages` (plain dicts, the whole history each time, as an
        OpenAI client sends it), recorded token-exactly in `segments`, the episode's sequences so far.

        A rendering that extends, as text, what an earlier completion left in the context is *not*
        re-tokenised: the sampler gets that context's exact ids plus the tokens of the new text only. One
        that extends none (the caller rewrote its history, or the template rewrites past turns) starts a
        new sequence. A template that cannot render the messages raises `ChatTemplateError`, and so do
        image parts: text only here (environment episodes take images, `hone.rollout.multiturn`)."""
        if has_images(messages):  # never rendered as a bare placeholder without its pixels
            raise ChatTemplateError("image content is not supported by Model.chat (text only)")
        try:
            text = chat_text(self.tokenizer, messages, tools=tools, add_generation_prompt=True)
        except Exception as e:  # the template rejects the conversation (a role it lacks, bad tools)
            raise ChatTemplateError(f"the chat template cannot render these messages: {e}") from e
        spans = [(s, n) for s in segments if (n := self._extends(s, text)) is not None]
        segment, covered = max(spans, key=lambda sn: sn[1]) if spans else (None, 0)
        if segment is not None:
            added = self.tokenizer.encode(text[covered:], add_special_tokens=False)
            prompt_ids = segment.context + added
        else:
            added, prompt_ids = [], render_prompt(self.tokenizer, messages, tools)
        request = GenerationRequest(request_id, 0, prompt_ids, params.max_new_tokens)
        [out] = await self.generate(request, replace(params, n=1))
        completion = completion_of(out, prompt_ids, self.tokenizer)
        if segment is None:
            segment = Trajectory(prompt_ids)
            segments.append(segment)
        else:  # what the conversation added since the last completion: in the context, not trained on
            segment.add_context(added)
        segment.add_completion(completion)
        segment.decode_text(self.tokenizer)
        return completion

    def _extends(self, segment: Trajectory, text: str) -> int | None:
        """How many characters of the rendering `text` the segment's context stands for, or None when
        `text` does not extend it. Besides a plain text prefix: a reply that ended on an eos other than
        the end-of-turn token the template writes (Qwen's `<|endoftext|>` where the template closes with
        `<|im_end|>`) still extends, its sampled eos standing for the template's token (as
        `ObservationRenderer` does for environment episodes), rather than splitting the episode."""
        if not segment.text:
            return None
        if text.startswith(segment.text):
            return len(segment.text)
        if (
            not segment.loss_mask
            or segment.loss_mask[-1] != 1
            or segment.context[-1] not in self.eos_token_ids
        ):
            return None
        eos = str(self.tokenizer.decode(segment.context[-1:], skip_special_tokens=False))
        before = segment.text[: len(segment.text) - len(eos)]
        if not eos or not segment.text.endswith(eos) or not text.startswith(before):
            return None
        rest = text[len(before) :]
        closing = next((t for t in self._special_texts if rest.startswith(t)), None)
        return None if closing is None else len(before) + len(closing)

    @functools.cached_property
    def _special_texts(self) -> list[str]:
        """The texts of the tokenizer's special tokens, longest first."""
        special = {str(t.content) for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        return sorted(special | set(self.tokenizer.all_special_tokens), key=len, reverse=True)


@dataclass
class EpisodeResult:
    """What one episode produced: its rollouts (a failed environment episode keeps its one, flagged in
    `env/errors`; a failed agent episode has none) and why it failed, if it did."""

    rollouts: list[Rollout]
    error: str | None = None  # one line: what went wrong, for the log
    timed_out: bool = False
    cause: BaseException | None = None


Job = Callable[[], Awaitable[EpisodeResult]]


class EpisodeKind(Protocol):
    """How a run plays a step's samples (single-turn, environment, agent): the one dispatch, chosen once."""

    multi_turn: bool  # episodes take turns (eval splits accuracy by turns)

    def jobs(
        self, model: Model, samples: Sequence[Sample], params: SamplingParams, *, last_only: bool = False
    ) -> list[Job]: ...

    def collect(self, results: list[EpisodeResult]) -> tuple[list[Rollout], dict[str, float]]: ...


async def play(
    model: Model,
    kind: EpisodeKind,
    samples: Sequence[Sample],
    params: SamplingParams,
    *,
    on_done: Callable[[list[Rollout]], None] | None = None,
    last_only: bool = False,
) -> tuple[list[Rollout], dict[str, float]]:
    """Play `kind`'s episodes of `samples` concurrently (group id = the sample's index), in sample order;
    `on_done(rollouts)` as each episode ends. Returns the rollouts and the kind's failure metrics."""
    jobs = kind.jobs(model, samples, params, last_only=last_only)
    # Every slot is open before any episode runs: a lock-step batch waits for all of them.
    slots = [model.batcher.open() for _ in jobs]

    async def run(job: Job, slot: int) -> EpisodeResult:
        _SLOT.set(slot)  # this task's own context
        EPISODE_WAITS.set(lambda waiting: (model.batcher.park if waiting else model.batcher.unpark)(slot))
        try:
            result = await job()
        finally:
            model.batcher.close(slot)
        if on_done is not None and result.rollouts:
            on_done(result.rollouts)
        return result

    tasks = [asyncio.ensure_future(run(job, slot)) for job, slot in zip(jobs, slots, strict=True)]
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return kind.collect(list(results))


# --- single-turn ---


async def single_turn(
    model: Model,
    sample: Sample,
    group_id: int,
    prompt_ids: list[int],
    params: SamplingParams,
    vision: VisionInputs | None = None,
) -> EpisodeResult:
    """One prompt's group: `params.n` responses in one request (as the engine batches them)."""
    request = GenerationRequest(sample.id, group_id, prompt_ids, vision=vision)
    return EpisodeResult(await model.generate(request, params))


@dataclass
class SingleTurn:
    """Single-turn generation; `encode` gives a sample's prompt ids (chat template, system prompt) and, for
    a prompt with images, their vision inputs."""

    encode: Callable[[Sample], tuple[list[int], VisionInputs | None]]
    multi_turn: bool = False

    def jobs(
        self, model: Model, samples: Sequence[Sample], params: SamplingParams, *, last_only: bool = False
    ) -> list[Job]:
        prompts = [self.encode(s) for s in samples]
        return [
            bind(single_turn, model, s, i, ids, params, vision)
            for i, (s, (ids, vision)) in enumerate(zip(samples, prompts, strict=True))
        ]

    def collect(self, results: list[EpisodeResult]) -> tuple[list[Rollout], dict[str, float]]:
        return [r for result in results for r in result.rollouts], {}


async def play_once(
    model: Model, kind: EpisodeKind, samples: Sequence[Sample], params: SamplingParams, **kw: Any
) -> tuple[list[Rollout], dict[str, float]]:
    """`play`, then the model's batcher closed (its generation thread ends)."""
    try:
        return await play(model, kind, samples, params, **kw)
    finally:
        await model.batcher.aclose()


def play_sync(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    kind: EpisodeKind,
    samples: Sequence[Sample],
    params: SamplingParams,
    *,
    last_only: bool = False,
    processor: ProcessorMixin | None = None,
) -> tuple[list[Rollout], dict[str, float]]:
    """`play` from synchronous code, on a loop and a batcher of its own; the model calls run on this thread
    (`run_serving`). `processor`: a vision-language model's, for episodes whose messages hold images."""

    def episodes(engine: Executor) -> Coroutine[Any, Any, tuple[list[Rollout], dict[str, float]]]:
        model = Model(Batcher(sampler, pool=engine), tokenizer, processor)
        return play_once(model, kind, samples, params, last_only=last_only)

    return run_serving(episodes)


def bind(fn: Callable[..., Awaitable[EpisodeResult]], *args: Any) -> Job:
    """An episode function with its arguments, as a `Job` to play."""
    return lambda: fn(*args)
