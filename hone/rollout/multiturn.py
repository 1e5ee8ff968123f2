"""Multi-turn rollouts: drive one `Environment` per trajectory with a `Sampler`, turn by turn.

A trajectory is one token sequence: the rendered initial messages (the prompt), then alternating
assistant tokens — kept *exactly as sampled*, never re-tokenised from text — and observation tokens
(tool results, game replies) that are in the context but masked out of the loss (`loss_mask` 0,
`sampler_logprobs` 0). Each turn, every live trajectory's whole context goes to the sampler in one
batch; environments step concurrently on one event loop (their `step` may be async).

Observation tokens come from the chat template, as the *difference* between a rendered conversation
with and without the new messages (on a fixed two-message stand-in, so templates that rewrite earlier
turns, e.g. dropping reasoning, can't shift it), plus the template's closing of an assistant message
(e.g. Qwen's "<|im_end|>\\n"). A turn that stopped on an eos already holds its end-of-turn token, the one
the model sampled: the closing's leading end-of-turn token is then dropped, whichever eos was sampled, and
only the rest of the closing (Qwen's "\\n") follows. A turn cut off by a limit gets the whole closing.

Limits: `max_turns` assistant turns, `max_tokens_per_turn`, and `max_total_tokens` for the whole
sequence (each episode's turn is capped by its own room left, whatever else is in the batch); an
episode that hits a limit before the environment says done ends with `finish_reason="length"` and
`metrics["episode/truncated"] = 1`. A "void turn" (SimpleTIR, Xue et al.
2025: a turn that produced nothing usable — empty, or cut off by the per-turn limit) is counted in
`metrics["episode/void_turns"]` so the trainer can filter such trajectories.

An environment that raises (in `reset` or `step`: a server error, a lost connection) ends that episode,
not the run: the rollout's `env/errors` metric is 1 (0 otherwise), the first error of a batch is logged,
and the producer leaves the episode out of training (its reward says nothing about the policy). A batch
whose every episode failed raises instead (a server down for good, a broken environment: the producer
retries the step, then the run stops with one line) rather than train on nothing step after step, as
`rollout.agent` does. Every environment's `close()` is called when the batch's episodes end, however
they ended.

A rollout's `response_text`, what text rewards score, is the final assistant message; `messages` holds the
whole conversation for rewards that want more.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from transformers import PreTrainedTokenizerBase

from hone.aio import run_coroutine
from hone.envs import Environment, Message, StepResult
from hone.rollout.base import GenerationRequest, Sampler
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


@dataclass
class Episodes:
    """How to play a multi-turn run: a fresh environment per episode, and the limits."""

    make_env: Callable[[], Environment]
    limits: EpisodeLimits


@dataclass
class _Episode:
    sample: Sample
    group_id: int
    env: Environment
    messages: list[Message]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)  # each sampled assistant message's text
    turn_rewards: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    done: bool = False
    truncated: bool = False

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def run_episodes(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    make_env: Callable[[], Environment],
    samples: Sequence[Sample],
    params: SamplingParams,
    limits: EpisodeLimits,
) -> list[Rollout]:
    """`params.n` trajectories per sample (group id = the sample's index), in sample order."""
    return run_coroutine(_play(sampler, tokenizer, make_env, samples, params, limits))


async def _play(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    make_env: Callable[[], Environment],
    samples: Sequence[Sample],
    params: SamplingParams,
    limits: EpisodeLimits,
) -> list[Rollout]:
    envs = [(i, s, make_env()) for i, s in enumerate(samples) for _ in range(params.n)]
    try:
        return await _play_envs(sampler, tokenizer, envs, limits, params)
    finally:  # every episode's session or connection, however the episodes ended
        await asyncio.gather(*(_attempt(env.close) for _, _, env in envs))


async def _play_envs(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    envs: list[tuple[int, Sample, Environment]],
    limits: EpisodeLimits,
    params: SamplingParams,
) -> list[Rollout]:
    starts = await asyncio.gather(*(_attempt(env.reset, s) for _, s, env in envs))
    failures: list[tuple[str, Exception]] = []
    episodes = []
    for (i, s, env), start in zip(envs, starts, strict=True):
        # An environment that failed to start: the sample's own prompt stands in, and the episode ends
        # before any turn (a rollout with no response, which the producer leaves out of training).
        msgs = _sample_messages(s) if isinstance(start, _EnvError) else list(start)
        e = _Episode(s, i, env, msgs, _render_prompt(tokenizer, msgs, env.tools))
        if isinstance(start, _EnvError):
            _fail(e, start, failures)
        episodes.append(e)
    eos = sampler.eos_token_ids
    render = _ObservationRenderer(tokenizer, eos)
    for turn in range(limits.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        for e in live:
            if len(e.context) >= limits.max_total_tokens:
                e.done = e.truncated = True
        live = [e for e in live if not e.done]
        # Each episode's own room: a shared cap would let the longest episode cut every other's turn.
        requests = [
            GenerationRequest(e.sample.id, e.group_id, e.context, _turn_budget(e, limits)) for e in live
        ]
        outs = sampler.generate(requests, _turn_params(params, limits.max_tokens_per_turn, turn))
        texts = [_take_turn(e, out, tokenizer) for e, out in zip(live, outs, strict=True)]
        results = await asyncio.gather(*(_attempt(e.env.step, t) for e, t in zip(live, texts, strict=True)))
        for e, out, text, result in zip(live, outs, texts, results, strict=True):
            if isinstance(result, _EnvError):
                e.messages.append({"role": "assistant", "content": text})
                e.turn_rewards.append(0.0)
                _fail(e, result, failures)
                continue
            ended = bool(out.response_ids) and out.response_ids[-1] in eos
            _apply(e, text, ended, result, render, limits, turn)
    for e in episodes:
        if not e.done:  # ran out of turns
            e.truncated = True
    if failures:
        sample_id, error = failures[0]
        if len(failures) == len(episodes):
            raise RuntimeError(
                f"every one of {len(episodes)} episodes ended on an environment error; the first, on sample "
                f"{sample_id!r}: {type(error).__name__}: {error}"
            ) from error
        log.warning(
            "%d of %d episodes ended on an environment error (counted in env/errors); the first, on sample "
            "%r: %s: %s",
            len(failures),
            len(episodes),
            sample_id,
            type(error).__name__,
            error,
        )
    return [_to_rollout(e, sampler.policy_version) for e in episodes]


@dataclass
class _EnvError:
    """An exception an environment raised, caught so that it ends one episode, not the run."""

    error: Exception


async def _attempt(method: Callable[..., Any], *args: Any) -> Any:
    try:
        return await _maybe_await(method(*args))
    except Exception as error:
        return _EnvError(error)


def _fail(e: _Episode, failure: _EnvError, failures: list[tuple[str, Exception]]) -> None:
    """End an episode on its environment's error, counted in `env/errors`."""
    e.done = True
    e.metrics[ENV_ERRORS] = 1.0
    failures.append((e.sample.id, failure.error))


def _sample_messages(sample: Sample) -> list[Message]:
    if sample.messages:
        return [dict(m) for m in sample.messages]
    return [{"role": "user", "content": sample.prompt or ""}]


def _turn_budget(e: _Episode, limits: EpisodeLimits) -> int:
    """New tokens this episode's next turn may take (its context is below `max_total_tokens`)."""
    return min(limits.max_tokens_per_turn, limits.max_total_tokens - len(e.context))


def _turn_params(params: SamplingParams, budget: int, turn: int) -> SamplingParams:
    seed = None if params.seed is None else derive_seed(params.seed, "turn", turn)
    return replace(params, n=1, max_new_tokens=budget, seed=seed)


def _take_turn(e: _Episode, out: Rollout, tokenizer: PreTrainedTokenizerBase) -> str:
    """Append the sampled tokens (trained on) and return the assistant message text."""
    start = len(e.response_ids)
    e.response_ids += out.response_ids
    e.loss_mask += [1] * out.response_len
    e.logprobs += out.sampler_logprobs
    e.turns.append((start, len(e.response_ids)))
    text = tokenizer.decode(out.response_ids, skip_special_tokens=True)
    e.replies.append(text)
    if not text.strip() or out.finish_reason == "length":
        e.metrics["episode/void_turns"] = e.metrics.get("episode/void_turns", 0.0) + 1
    return text


def _apply(
    e: _Episode,
    text: str,
    ended: bool,
    result: StepResult,
    render: _ObservationRenderer,
    limits: EpisodeLimits,
    turn: int,
) -> None:
    """Record the environment's answer to a turn (`ended`: the turn stopped on an eos token)."""
    e.messages.append({"role": "assistant", "content": text})
    e.turn_rewards.append(float(result.reward))
    for key, value in result.info.items():
        e.metrics[f"env/{key}"] = e.metrics.get(f"env/{key}", 0.0) + float(value)
    if result.done:
        e.done = True
        return
    if turn + 1 >= limits.max_turns:
        e.done = e.truncated = True
        return
    obs_ids = render(result.messages, ended_with_eos=ended, tools=e.env.tools)
    e.messages += result.messages
    room = limits.max_total_tokens - len(e.context)
    if len(obs_ids) >= room:  # no room left for the observation and a reply
        e.done = e.truncated = True
        return
    e.response_ids += obs_ids
    e.loss_mask += [0] * len(obs_ids)
    e.logprobs += [0.0] * len(obs_ids)


def _to_rollout(e: _Episode, version: int) -> Rollout:
    e.metrics.setdefault(ENV_ERRORS, 0.0)
    e.metrics["episode/turns"] = float(len(e.turns))
    e.metrics["episode/truncated"] = float(e.truncated)
    return Rollout(
        sample_id=e.sample.id,
        group_id=e.group_id,
        token_ids=e.context,
        prompt_len=len(e.prompt_ids),
        loss_mask=e.loss_mask,
        sampler_logprobs=e.logprobs,
        # What text rewards score: the final assistant message, never the observations (a tool result
        # holding the right number must not pass `math`'s last-number fallback). `messages` has it all.
        response_text=e.replies[-1] if e.replies else "",
        finish_reason="length" if e.truncated else "stop",
        policy_version=version,
        turns=e.turns,
        metrics=e.metrics,
        messages=e.messages,
        turn_rewards=e.turn_rewards,
    )


class _ObservationRenderer:
    """Token ids the chat template puts between a sampled assistant turn and the next one."""

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
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )


def _render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict] | None
) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


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
    ids = _render_prompt(tokenizer, messages[:first], tools)
    mask = [0] * len(ids)
    render = _ObservationRenderer(tokenizer, eos_ids)
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
