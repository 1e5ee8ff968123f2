"""Environment episodes: drive one `Environment` per trajectory through the `Model`, turn by turn.

A trajectory is one token sequence (`Trajectory`): the rendered initial messages (the prompt), then
alternating assistant tokens, kept *exactly as sampled*, and observation tokens (tool results, game
replies, `ObservationRenderer`) that are in the context but masked out of the loss. Every live episode's
turn is sampled in one batch (the batcher flushes when all of them wait, each turn seeded by its index);
environments step concurrently on one event loop (their `step` may be async).

Limits: `max_turns` assistant turns, `max_tokens_per_turn`, and `max_total_tokens` for the whole
sequence (each episode's turn is capped by its own room left, whatever else is in the batch); an
episode that hits a limit before the environment says done ends with `finish_reason="length"` and
`metrics["episode/truncated"] = 1`. A "void turn" (SimpleTIR, Xue et al. 2025: a turn that produced
nothing usable: empty, or cut off by the per-turn limit) is counted in `metrics["episode/void_turns"]`
so the trainer can filter such trajectories.

An environment that raises (in `reset`, `step` or its own `play`: a server error, a lost connection)
ends that episode, not the run: the rollout's `env/errors` metric is 1 (0 otherwise), the first error of
a batch is logged, and the producer leaves the episode out of training. A batch whose every episode
failed raises instead (a server down for good, a broken environment: the producer retries the step,
then the run stops with one line), and so does a run most of whose episodes fail: once a batch and the
run so far both lost more than half (after 16 episodes), `MostEpisodesFailedError` stops it, not retried.
Every environment's `close()` is called when its episode ends,
however it ended.

A rollout's `response_text`, what text rewards score, is the final assistant message; `messages` holds the
whole conversation for rewards that want more.

Images (a vision-language model, `Model.processor`): `reset` and `step` may return messages whose content
is a list of parts, `{"type": "image", "image": <PIL image | bytes | path>}` beside text parts (the HF
processor's chat format; MGPO-style crops, a screenshot, a rendered board: `hone.envs.games.zoom`). The
opening's bare `{"type": "image"}` parts take the sample's `images`. Each image is expanded by the
processor, its pixels go with every later turn's request (`Trajectory.vision`, reused from the engine's
prefix cache) and with the rollout for training; `messages` records image parts bare. A text-only model
given an image stops the run with one line (`ImageObservationError`): not the environment's error.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from transformers import PreTrainedTokenizerBase
from transformers.processing_utils import ProcessorMixin

from hone.data.images import has_images
from hone.envs import Environment, Message, StepResult
from hone.errors import HoneError
from hone.rollout.base import GenerationRequest, Sampler
from hone.rollout.episodes import EpisodeResult, Job, Model, bind, play_sync
from hone.rollout.trajectory import (
    ImageObservationError,
    ObservationRenderer,
    Trajectory,
    completion_of,
    render_opening,
    render_prompt,
)
from hone.seeding import derive_seed
from hone.types import Rollout, Sample, SamplingParams

log = logging.getLogger("hone")
# Per-episode metric: 1 when the environment raised (in reset or step) and the episode ended there.
ENV_ERRORS = "env/errors"


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
        self.fatal: ImageObservationError | None = None  # the model cannot take the episode's images

    def start(self, messages: list[Message]) -> None:
        """The initial messages: the prompt (their images too: the sample's fill bare image parts)."""
        model, where = self.model, f"sample {self.sample.id!r}: the opening messages"
        with self._seeing():
            ids, self.messages, vision = render_opening(
                model.tokenizer, messages, self.tools, model.processor, self.sample.images, where
            )
        self.trajectory = Trajectory(ids, vision=vision)

    @contextlib.contextmanager
    def _seeing(self) -> Iterator[None]:
        try:
            yield
        except ImageObservationError as error:  # kept: it ends the run, even out of an env's own `play`
            self.fatal = error
            raise

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
        context, vision = self.trajectory.context, self.trajectory.vision
        request = GenerationRequest(self.sample.id, self.group_id, context, budget, vision=vision)
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
        where = f"sample {self.sample.id!r}: the observation after turn {turn + 1}"
        with self._seeing():
            obs_ids, observation, vision = self.render.observe(
                result.messages, ended_with_eos=self.ended, tools=self.tools, where=where
            )
        self.messages += observation
        if len(obs_ids) >= self.limits.max_total_tokens - len(self.trajectory.context):  # no room left
            self.done = self.truncated = True
            return
        self.trajectory.add_context(obs_ids, vision)

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
            # The oldest version of its tokens (a publish may land between turns, or within one).
            policy_version=min((c.policy_version for c in completions), default=self.model.policy_version),
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
    episode.tools = env.tools  # read after reset: a TRL multi-environment row chooses its tools there
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
        if episode.fatal is not None:  # the model cannot see its images: no environment's fault
            raise episode.fatal from None
        if episode.trajectory is None:
            episode.start(_sample_messages(episode.sample))
        elif len(episode.turn_rewards) < len(episode.trajectory.turns):
            episode.turn_rewards.append(0.0)  # the turn it failed to answer
        episode.fail(error)
        return episode.result()
    if episode.fatal is not None:  # raised out of `chat` and swallowed by the environment's own code
        raise episode.fatal
    if episode.trajectory is None:  # it ended without a turn: its opening is the sample's prompt
        episode.start(_sample_messages(episode.sample))
        episode.done = True
        return episode.result()
    episode.answer(replace(end, done=True))
    return episode.result()


class MostEpisodesFailedError(HoneError, RuntimeError):
    """Most of a run's episodes ended on an environment error: a deliberate stop, not retried (an
    environment that serves one episode of a batch, a broken server), where going on would train on the
    few that survived."""


# A run stops once a batch and the run so far both lost more than half their episodes, after this many
# episodes (one unlucky small batch is not a trend).
_MOST_FAILED_AFTER = 16


@dataclass
class Episodes:
    """How to play a multi-turn run: a fresh environment per episode, and the limits. It tallies the
    episodes played and failed over the run (`MostEpisodesFailedError`)."""

    make_env: Callable[[], Environment]
    limits: EpisodeLimits
    multi_turn: bool = True
    played: int = field(default=0, init=False)
    failed: int = field(default=0, init=False)

    def jobs(
        self, model: Model, samples: Sequence[Sample], params: SamplingParams, *, last_only: bool = False
    ) -> list[Job]:
        """`params.n` episodes per sample; every environment is made first, in order (a factory may count)."""
        envs = [(i, s, self.make_env()) for i, s in enumerate(samples) for _ in range(params.n)]
        render = ObservationRenderer(model.tokenizer, model.eos_token_ids, model.processor)

        async def job(i: int, s: Sample, env: Environment) -> EpisodeResult:
            try:
                result = await env_episode(model, s, i, env, params, self.limits, render)
                state = env.reward_state()  # for TRL rewards' `environments=`, until the rollout is scored
                for rollout in result.rollouts:
                    rollout.env_state = state
                return result
            finally:  # the episode's session or connection, however it ended
                await _attempt(env.close)

        return [bind(job, i, s, env) for i, s, env in envs]

    def collect(self, results: list[EpisodeResult]) -> tuple[list[Rollout], dict[str, float]]:
        failures = [r for r in results if r.error is not None]
        self.played, self.failed = self.played + len(results), self.failed + len(failures)
        if failures:
            first = failures[0]
            if (
                self.played >= _MOST_FAILED_AFTER
                and 2 * len(failures) > len(results)
                and 2 * self.failed > self.played
            ):
                raise MostEpisodesFailedError(
                    f"{self.failed} of the run's {self.played} episodes ended on an environment error "
                    f"({len(failures)} of the last {len(results)}), so the run stops; the first of the last, "
                    f"{first.error}"
                ) from first.cause
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
    images = [{"type": "image"} for _ in sample.images or ()]  # filled with the sample's, in order
    text = sample.prompt or ""
    return [{"role": "user", "content": [*images, {"type": "text", "text": text}] if images else text}]


def _turn_params(params: SamplingParams, budget: int, turn: int) -> SamplingParams:
    """A turn's parameters: one response, seeded per turn (every live episode's turn is one batch)."""
    seed = None if params.seed is None else derive_seed(params.seed, "turn", turn)
    return replace(params, n=1, max_new_tokens=budget, seed=seed)


def run_episodes(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    make_env: Callable[[], Environment],
    samples: Sequence[Sample],
    params: SamplingParams,
    limits: EpisodeLimits,
    processor: ProcessorMixin | None = None,
) -> list[Rollout]:
    """`params.n` trajectories per sample (group id = the sample's index), in sample order; `processor`
    (a vision-language model's) for environments whose messages hold images."""
    kind = Episodes(make_env, limits)
    return play_sync(sampler, tokenizer, kind, samples, params, processor=processor)[0]


def demonstration_tokens(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    tools: list[dict] | None = None,
    eos_ids: frozenset[int] | None = None,
) -> tuple[list[int], list[int]]:
    """A scripted conversation laid out exactly as `run_episodes` lays out a sampled one: token ids and
    a 0/1 train mask (1 on assistant tokens and their eos, 0 on the prompt and observations), for SFT.

    Each assistant turn ends with the tokenizer's eos, which must be one of `eos_ids`, the ids the
    sampler stops on (`Sampler.eos_token_ids`; default: that eos alone): SFT must not teach a turn end
    the episodes would not read as one. Observations follow as after a sampled eos.

    An assistant message with `"weight": 0` (OpenAI's chat fine-tuning convention) stays in the context
    but is not trained on: e.g. a wrong first try that shows the model how to recover, not how to err.
    """
    if has_images(messages):  # rendered as text, an image part would be a placeholder without its pixels
        raise ImageObservationError("multi-turn SFT demonstrations with images are not supported yet")
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        raise ValueError("a demonstration needs initial messages followed by at least one assistant turn")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("multi-turn SFT needs a tokenizer with an eos token (it ends every assistant turn)")
    eos_ids = frozenset([eos]) if eos_ids is None else eos_ids
    if eos not in eos_ids:
        raise ValueError(
            f"multi-turn SFT ends turns with the tokenizer's eos {tokenizer.eos_token!r} (id {eos}), but "
            f"generation stops on ids {sorted(eos_ids)} only (generation_config.eos_token_id): add it there"
        )
    ids = render_prompt(tokenizer, messages[:first], tools)
    mask = [0] * len(ids)
    render = ObservationRenderer(tokenizer, eos_ids)
    observation: list[Message] = []
    for message in messages[first:]:
        if message["role"] != "assistant":
            observation.append(message)
            continue
        if observation:
            obs_ids = render(observation, ended_with_eos=True, tools=tools)
            ids, mask, observation = ids + obs_ids, mask + [0] * len(obs_ids), []
        weight = message.get("weight", 1)
        if weight not in (0, 1):
            raise ValueError(f"an assistant message's weight must be 0 or 1, got {weight!r}")
        turn = [*tokenizer.encode(message["content"], add_special_tokens=False), eos]
        ids, mask = ids + turn, mask + [int(weight)] * len(turn)
    return ids, mask
