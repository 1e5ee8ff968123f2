"""Agent programs as rollouts: `rollout.agent: mypkg.agents:run` names `async def run(client, sample)`.

Each episode registers with the run's `EndpointServer` and the agent gets, as its first argument, an
`openai.AsyncOpenAI` client already pointed at the episode's base URL, or the base URL itself (a `str`)
when that parameter is named `base_url` (for agents built on another client library). It returns the
episode's reward: a number, or one score per turn (summed by `reward.fn: env`, like an environment's).

The trajectory is what the server recorded for the episode (`endpoint.py`): normally one token sequence,
every sampled token trained on and nothing else. An episode whose requests did not all extend one
context has several sequences; each becomes a rollout of the episode's group with the episode's
reward (`episode/segments` counts them), and evaluation scores the last one only.

An agent that raises, returns something that is not a reward, times out (`rollout.agent_timeout_s`) or
never calls the model is counted in `env/errors` (timeouts also in `env/timeouts`) and its episode is
dropped; the run goes on. Only a step whose every episode failed raises (a broken agent, not bad luck).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hone.aio import run_coroutine
from hone.plugins import load_object
from hone.rollout.episodes import EpisodeResult, Job, Model
from hone.rollout.trajectory import Trajectory
from hone.types import Rollout, Sample, SamplingParams

if TYPE_CHECKING:  # the server needs aiohttp (the `agents` extra): imported where one is started
    from hone.rollout.endpoint import EndpointServer

log = logging.getLogger("hone")

AgentFn = Callable[[Any, Sample], Awaitable[Any]]


@dataclass(frozen=True)
class AgentSpec:
    fn: AgentFn
    wants_base_url: bool  # the first parameter is named `base_url`: pass the URL, not a client


def load_agent(spec: str) -> AgentSpec:
    """The agent function `spec` names (`pkg.mod:fn`), checked; a `ValueError` of one line otherwise."""
    where = f"rollout.agent {spec!r}"
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{where}: expected 'pkg.module:function'")
    fn = load_object(spec, what=where)
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"{where} is not an async function; define it as `async def {attr}(client, sample)`")
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(params) != 2:
        names = ", ".join(p.name for p in params) or "none"
        raise ValueError(
            f"{where} must take two arguments (client or base_url, sample); its required ones are: {names}"
        )
    wants_base_url = params[0].name == "base_url"
    try:
        import aiohttp  # noqa: F401  (the endpoint's server)
    except ImportError:
        raise ValueError(f"{where} needs the aiohttp package: pip install 'hone[agents]'") from None
    if not wants_base_url:
        try:
            import openai  # noqa: F401
        except ImportError:
            raise ValueError(
                f"{where} takes a client: install the openai package (pip install 'hone[agents]'), "
                "or name its first parameter base_url"
            ) from None
    return AgentSpec(fn, wants_base_url)


@dataclass
class AgentRollouts:
    rollouts: list[Rollout]
    metrics: dict[str, float]  # env/errors, env/timeouts: failed episodes; the endpoint's counts


@dataclass
class AgentEpisodeResult(EpisodeResult):
    """An agent episode's result and what the endpoint counted while serving it (`EpisodeRecord.counts`),
    failed episodes included: a refused reply often makes the agent fail."""

    counts: dict[str, float] = field(default_factory=dict)


class AgentEpisodes:
    """Agent episodes against the endpoint, `concurrency` at a time: an `EpisodeKind` (the agent calls
    the model over HTTP, so the step's own `Model` goes unused; the endpoint's `Model.chat` serves it)."""

    multi_turn = True

    def __init__(
        self,
        agent: AgentSpec,
        server: EndpointServer,
        *,
        concurrency: int,
        timeout_s: float,
        max_completions: int,
    ) -> None:
        self.agent, self.server = agent, server
        self.concurrency, self.timeout_s, self.max_completions = concurrency, timeout_s, max_completions

    def play(
        self, samples: Sequence[Sample], params: SamplingParams, *, last_segment_only: bool = False
    ) -> AgentRollouts:
        """Rollouts of every episode that succeeded (group id = the sample's index), in sample order."""

        async def run() -> list[EpisodeResult]:
            jobs = self.jobs(None, samples, params, last_only=last_segment_only)
            return list(await asyncio.gather(*(job() for job in jobs)))

        return AgentRollouts(*self.collect(run_coroutine(run())))

    def close(self) -> None:
        self.server.close()

    def jobs(
        self,
        model: Model | None,
        samples: Sequence[Sample],
        params: SamplingParams,
        *,
        last_only: bool = False,
    ) -> list[Job]:
        """`params.n` episodes per sample; at most `concurrency` run at once."""
        gate = asyncio.Semaphore(self.concurrency)
        return [
            functools.partial(self._episode, gate, i, s, params, last_only)
            for i, s in enumerate(samples)
            for _ in range(params.n)
        ]

    def collect(self, results: list[EpisodeResult]) -> tuple[list[Rollout], dict[str, float]]:
        """The rollouts and `env/errors`, `env/timeouts` and the endpoint's counts, summed over the
        episodes (`env/tool_choice_violations`, `env/dropped_tool_calls`); raises when every episode
        failed."""
        errors = [r.error for r in results if r.error is not None]
        if errors:
            log.warning(
                "%d of %d agent episodes failed (env/errors); first: %s", len(errors), len(results), errors[0]
            )
        rollouts = [r for result in results for r in result.rollouts]
        if not rollouts:
            raise RuntimeError(f"every one of {len(results)} agent episodes failed; first: {errors[0]}")
        timeouts = sum(r.timed_out for r in results)
        counts: dict[str, float] = {}
        for r in results:
            for key, value in (r.counts if isinstance(r, AgentEpisodeResult) else {}).items():
                counts[key] = counts.get(key, 0.0) + value
        return rollouts, {"env/errors": float(len(errors)), "env/timeouts": float(timeouts), **counts}

    async def _episode(
        self, gate: asyncio.Semaphore, group: int, sample: Sample, params: SamplingParams, last_only: bool
    ) -> EpisodeResult:
        """The agent's episode: its rollouts, or none and why it failed."""
        failure: AgentEpisodeResult | None = None
        async with gate:
            episode_id = self.server.open_episode(params, self.max_completions)
            base_url = self.server.base_url(episode_id)
            client = None if self.agent.wants_base_url else _client(base_url, self.timeout_s)
            try:
                value = await asyncio.wait_for(
                    self.agent.fn(base_url if client is None else client, sample), self.timeout_s
                )
                reward = _reward(value)
            except TimeoutError:
                why = f"timed out after {self.timeout_s:g} s (rollout.agent_timeout_s)"
                failure = AgentEpisodeResult([], why, timed_out=True)
            except Exception as e:  # the agent's own failure: counted, the episode dropped
                failure = AgentEpisodeResult([], " ".join(f"{type(e).__name__}: {e}".split()))
            finally:
                record = self.server.close_episode(episode_id)
                if client is not None:
                    await client.close()
        if failure is None and not record.segments:
            failure = AgentEpisodeResult([], "the agent returned without calling the model")
        if failure is not None:
            failure.counts = record.counts
            return failure
        segments = record.segments[-1:] if last_only else record.segments
        return AgentEpisodeResult(
            [_to_rollout(sample, group, s, reward, len(record.segments)) for s in segments],
            counts=record.counts,
        )


def _client(base_url: str, timeout_s: float) -> Any:
    import openai

    # No retries: a refused request (a limit, a bad field) is the agent's error to see, not to repeat.
    return openai.AsyncOpenAI(base_url=base_url, api_key="hone", max_retries=0, timeout=timeout_s)


def _reward(value: Any) -> list[float]:
    """The agent's return value as per-turn rewards: a number is one score for the episode."""
    if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
        raise TypeError(
            f"the agent returned {type(value).__name__}, not a reward (a number or a list of them)"
        )
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise TypeError(f"the agent returned {value!r}, not a reward (a number or a list of numbers)")
    return [float(v) for v in values]


def _to_rollout(sample: Sample, group: int, seg: Trajectory, reward: list[float], segments: int) -> Rollout:
    last = seg.completions[-1]
    return seg.to_rollout(
        sample.id,
        group,
        response_text=last.text,
        finish_reason=last.finish_reason,
        policy_version=min(c.policy_version for c in seg.completions),
        metrics={"episode/turns": float(len(seg.completions)), "episode/segments": float(segments)},
        turn_rewards=reward,
    )
