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

Environment episodes (`env_episode`), the rules: the rendered initial messages are the prompt; each
assistant turn's tokens are kept as sampled and each observation is the chat template's difference
(`ObservationRenderer`), masked out of the loss. Limits: `max_turns` assistant turns,
`max_tokens_per_turn`, and `max_total_tokens` for the whole sequence (each turn is capped by its own room
left); an episode that hits a limit before the environment says done ends with `finish_reason="length"`
and `metrics["episode/truncated"] = 1`. A "void turn" (SimpleTIR, Xue et al. 2025: empty, or cut off by
the per-turn limit) is counted in `metrics["episode/void_turns"]` so the trainer can filter them. An
environment that raises (in `reset` or `step`) ends that episode, not the run: `env/errors` is 1 and the
producer leaves it out of training; a batch whose every episode failed raises instead. A rollout's
`response_text` is the final assistant message; `messages` holds the whole conversation.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase

from hone.aio import run_coroutine
from hone.envs import Environment, Message, StepResult
from hone.rollout.base import GenerationRequest, Sampler
from hone.rollout.batcher import Batcher
from hone.rollout.trajectory import (
    Completion,
    ObservationRenderer,
    Trajectory,
    completion_of,
    render_prompt,
)
from hone.seeding import derive_seed
from hone.types import Rollout, Sample, SamplingParams

log = logging.getLogger("hone")
# Per-episode metric: 1 when the environment raised (in reset or step) and the episode ended there.
ENV_ERRORS = "env/errors"

_SLOT: contextvars.ContextVar[int] = contextvars.ContextVar("hone_episode_slot", default=-1)


class ChatTemplateError(ValueError):
    """The chat template cannot render a conversation `Model.chat` was given (the caller's error)."""


class Model:
    """What an episode samples through: the run's batcher, tokenizer and end-of-turn ids."""

    def __init__(self, batcher: Batcher, tokenizer: PreTrainedTokenizerBase) -> None:
        self.batcher, self.tokenizer = batcher, tokenizer
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
        new sequence. A template that cannot render the messages raises `ChatTemplateError`."""
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # the template rejects the conversation (a role it lacks, bad tools)
            raise ChatTemplateError(f"the chat template cannot render these messages: {e}") from e
        extended = [s for s in segments if s.text and text.startswith(s.text)]
        segment = max(extended, key=lambda s: len(s.text)) if extended else None
        if segment is not None:
            added = self.tokenizer.encode(text[len(segment.text) :], add_special_tokens=False)
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
    model: Model, sample: Sample, group_id: int, prompt_ids: list[int], params: SamplingParams
) -> EpisodeResult:
    """One prompt's group: `params.n` responses in one request (as the engine batches them)."""
    return EpisodeResult(await model.generate(GenerationRequest(sample.id, group_id, prompt_ids), params))


@dataclass
class SingleTurn:
    """Single-turn generation; `encode` gives a sample's prompt ids (chat template, system prompt)."""

    encode: Callable[[Sample], list[int]]
    multi_turn: bool = False

    def jobs(
        self, model: Model, samples: Sequence[Sample], params: SamplingParams, *, last_only: bool = False
    ) -> list[Job]:
        prompts = [self.encode(s) for s in samples]
        return [
            _bind(single_turn, model, s, i, ids, params)
            for i, (s, ids) in enumerate(zip(samples, prompts, strict=True))
        ]

    def collect(self, results: list[EpisodeResult]) -> tuple[list[Rollout], dict[str, float]]:
        return [r for result in results for r in result.rollouts], {}


# --- environment episodes ---


@dataclass
class EpisodeLimits:
    max_turns: int = 8
    max_tokens_per_turn: int = 64
    max_total_tokens: int = 1024


class _Cut(BaseException):
    """Raised out of `chat` into an environment's own code when a limit ends its episode: a
    BaseException, so that the environment's `except Exception` handlers let it pass."""


class _EnvTurns:
    """One environment episode's state: its trajectory, conversation, per-turn rewards and metrics, and
    the turn it is at. Both ways an environment is played go through it: `env_episode` calls `step`
    after each turn; an environment with its own `play` calls `chat` (see `env_episode`)."""

    def __init__(
        self,
        model: Model,
        sample: Sample,
        group_id: int,
        env: Environment,
        params: SamplingParams,
        limits: EpisodeLimits,
        render: ObservationRenderer,
    ) -> None:
        self.model, self.sample, self.group_id, self.tools = model, sample, group_id, env.tools
        self.params, self.limits, self.render = params, limits, render
        self.messages: list[Message] = []
        self.trajectory: Trajectory | None = None
        self.turn = 0
        self.turn_rewards: list[float] = []
        self.metrics: dict[str, float] = {}
        self.done = self.truncated = False
        self.error: Exception | None = None
        self.ended = False  # the last turn stopped on an eos token

    def start(self, messages: list[Message]) -> None:
        """The initial messages: the prompt."""
        self.messages = list(messages)
        self.trajectory = Trajectory(render_prompt(self.model.tokenizer, self.messages, self.tools))

    def fail(self, error: Exception) -> None:
        """End the episode on its environment's error, counted in `env/errors`."""
        self.done = True
        self.metrics[ENV_ERRORS] = 1.0
        self.error = error

    async def sample_turn(self) -> str | None:
        """The next assistant turn's text, or None when a limit ends the episode first."""
        assert self.trajectory is not None
        if self.done or self.turn >= self.limits.max_turns:
            return None
        room = self.limits.max_total_tokens - len(self.trajectory.context)
        if room <= 0:
            self.done = self.truncated = True
            return None
        # Each episode's own room: a shared cap would let the longest episode cut every other's turn.
        budget = min(self.limits.max_tokens_per_turn, room)
        request = GenerationRequest(self.sample.id, self.group_id, self.trajectory.context, budget)
        turn_params = _turn_params(self.params, self.limits.max_tokens_per_turn, self.turn)
        [out] = await self.model.generate(request, turn_params)
        completion = completion_of(out, request.prompt_ids, self.model.tokenizer)
        self.trajectory.add_completion(completion)
        if not completion.text.strip() or out.finish_reason == "length":
            self.metrics["episode/void_turns"] = self.metrics.get("episode/void_turns", 0.0) + 1
        self.messages.append({"role": "assistant", "content": completion.text})
        self.ended = bool(out.response_ids) and out.response_ids[-1] in self.model.eos_token_ids
        return completion.text

    def answer(self, result: StepResult) -> None:
        """Record the environment's answer to the turn just sampled."""
        assert self.trajectory is not None
        turn, self.turn = self.turn, self.turn + 1
        self.turn_rewards.append(float(result.reward))
        for key, value in result.info.items():
            self.metrics[f"env/{key}"] = self.metrics.get(f"env/{key}", 0.0) + float(value)
        if result.done:
            self.done = True
            return
        if turn + 1 >= self.limits.max_turns:
            self.done = self.truncated = True
            return
        obs_ids = self.render(result.messages, ended_with_eos=self.ended, tools=self.tools)
        self.messages += result.messages
        if len(obs_ids) >= self.limits.max_total_tokens - len(self.trajectory.context):  # no room left
            self.done = self.truncated = True
            return
        self.trajectory.add_context(obs_ids)

    async def chat(self, messages: list[Message], info: dict[str, float] | None = None) -> str:
        """For an environment's own code: the first call's `messages` open the conversation; a later
        call's are the environment's answer to the last turn (with `info`, as a `StepResult`'s)."""
        if self.trajectory is None:
            self.start(messages)
        else:
            self.answer(StepResult(list(messages), info=dict(info or {})))
        text = await self.sample_turn()
        if text is None:
            raise _Cut
        return text

    def result(self) -> EpisodeResult:
        assert self.trajectory is not None
        if not self.done:  # ran out of turns
            self.truncated = True
        self.metrics.setdefault(ENV_ERRORS, 0.0)
        self.metrics["episode/turns"] = float(len(self.trajectory.turns))
        self.metrics["episode/truncated"] = float(self.truncated)
        completions = self.trajectory.completions
        rollout = self.trajectory.to_rollout(
            self.sample.id,
            self.group_id,
            # What text rewards score: the final assistant message, never the observations (a tool result
            # holding the right number must not pass `math`'s last-number fallback). `messages` has all.
            response_text=completions[-1].text if completions else "",
            finish_reason="length" if self.truncated else "stop",
            policy_version=self.model.policy_version,
            metrics=self.metrics,
            messages=self.messages,
            turn_rewards=self.turn_rewards,
        )
        if self.error is None:
            return EpisodeResult([rollout])
        error = f"on sample {self.sample.id!r}: {type(self.error).__name__}: {self.error}"
        return EpisodeResult([rollout], error, cause=self.error)


async def env_episode(
    model: Model,
    sample: Sample,
    group_id: int,
    env: Environment,
    params: SamplingParams,
    limits: EpisodeLimits,
    render: ObservationRenderer,
) -> EpisodeResult:
    """Play `env` on `sample` turn by turn (see the module docstring for the rules).

    An environment whose own code calls the model (a verifiers environment, an agent harness) defines
    `async def play(sample, chat) -> StepResult` instead of being stepped: `await chat(messages, info)`
    opens the conversation, then answers each turn with its new messages (and that turn's `info`) and
    returns the next reply; `play` returns the last turn's result (`done`, its reward and info). The
    same limits apply: a call past one raises out of `chat` (not an `Exception`) and ends the episode."""
    episode = _EnvTurns(model, sample, group_id, env, params, limits, render)
    play = getattr(env, "play", None)
    if play is not None:
        return await _played(episode, play)
    start = await _attempt(env.reset, sample)
    if isinstance(start, _EnvError):
        # An environment that failed to start: the sample's own prompt stands in, and the episode ends
        # before any turn (a rollout with no response, which the producer leaves out of training).
        episode.start(_sample_messages(sample))
        episode.fail(start.error)
        return episode.result()
    episode.start(start)
    while (text := await episode.sample_turn()) is not None:
        result = await _attempt(env.step, text)
        if isinstance(result, _EnvError):
            episode.turn_rewards.append(0.0)
            episode.fail(result.error)
            break
        episode.answer(result)
    return episode.result()


async def _played(episode: _EnvTurns, play: Callable[..., Awaitable[StepResult]]) -> EpisodeResult:
    """An environment that plays itself, calling `episode.chat` for each turn."""
    try:
        end = await play(episode.sample, episode.chat)
    except _Cut:  # a limit ended it (recorded as truncated, or its turns ran out)
        return episode.result()
    except Exception as error:  # its code failed: the episode ends there, counted in env/errors
        if episode.trajectory is None:
            episode.start(_sample_messages(episode.sample))
        elif len(episode.turn_rewards) < len(episode.trajectory.turns):
            episode.turn_rewards.append(0.0)  # the turn it failed to answer
        episode.fail(error)
        return episode.result()
    if episode.trajectory is None:  # it ended without a turn: its opening is the sample's prompt
        episode.start(_sample_messages(episode.sample))
        episode.done = True
        return episode.result()
    episode.answer(replace(end, done=True))
    return episode.result()


@dataclass
class Episodes:
    """How to play a multi-turn run: a fresh environment per episode, and the limits."""

    make_env: Callable[[], Environment]
    limits: EpisodeLimits
    multi_turn: bool = True

    def jobs(
        self, model: Model, samples: Sequence[Sample], params: SamplingParams, *, last_only: bool = False
    ) -> list[Job]:
        """`params.n` episodes per sample; every environment is made first, in order (a factory may count)."""
        envs = [(i, s, self.make_env()) for i, s in enumerate(samples) for _ in range(params.n)]
        render = ObservationRenderer(model.tokenizer, model.eos_token_ids)

        async def job(i: int, s: Sample, env: Environment) -> EpisodeResult:
            try:
                return await env_episode(model, s, i, env, params, self.limits, render)
            finally:  # the episode's session or connection, however it ended
                await _attempt(env.close)

        return [_bind(job, i, s, env) for i, s, env in envs]

    def collect(self, results: list[EpisodeResult]) -> tuple[list[Rollout], dict[str, float]]:
        failures = [r for r in results if r.error is not None]
        if failures:
            first = failures[0]
            if len(failures) == len(results):  # a server down for good, a broken environment
                raise RuntimeError(
                    f"every one of {len(results)} episodes ended on an environment error; the first, "
                    f"{first.error}"
                ) from first.cause
            log.warning(
                "%d of %d episodes ended on an environment error (counted in env/errors); the first, %s",
                len(failures),
                len(results),
                first.error,
            )
        return [r for result in results for r in result.rollouts], {}


@dataclass
class _EnvError:
    """An exception an environment raised, caught so that it ends one episode, not the run."""

    error: Exception


async def _attempt(method: Callable[..., Any], *args: Any) -> Any:
    try:
        value = method(*args)
        return await value if inspect.isawaitable(value) else value
    except Exception as error:
        return _EnvError(error)


def _sample_messages(sample: Sample) -> list[Message]:
    if sample.messages:
        return [dict(m) for m in sample.messages]
    return [{"role": "user", "content": sample.prompt or ""}]


def _turn_params(params: SamplingParams, budget: int, turn: int) -> SamplingParams:
    """A turn's parameters: one response, seeded per turn (every live episode's turn is one batch)."""
    seed = None if params.seed is None else derive_seed(params.seed, "turn", turn)
    return replace(params, n=1, max_new_tokens=budget, seed=seed)


def _bind(fn: Callable[..., Awaitable[EpisodeResult]], *args: Any) -> Job:
    return lambda: fn(*args)


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
) -> tuple[list[Rollout], dict[str, float]]:
    """`play` from synchronous code, on a loop and a batcher of its own."""
    model = Model(Batcher(sampler), tokenizer)
    return run_coroutine(play_once(model, kind, samples, params, last_only=last_only))
