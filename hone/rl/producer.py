"""The producer: prompts → sample → score → filter → scored, version-stamped groups.

It reads the sampler, the reward and the environment and nothing of the learner: every rollout carries
the weight version that generated it (`Rollout.policy_version`), so whoever trains on a `ScoredGroups`
knows how stale it is. Sampling is seeded by the step the prompts belong to, so producing the same step
again (a resumed run) samples the same rollouts from the same weights.
"""

from __future__ import annotations

import logging
import math
import random
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

from hone.aio import run_serving
from hone.config import DataConfig, DynamicSamplingConfig, HoneConfig, RolloutConfig
from hone.rewards import RewardScorer, reward_failed, score_rollouts, top_answer_share
from hone.rewards.trl_contract import TrainerState
from hone.rl.collapse import collapse_metrics
from hone.rl.components import ProducerParts
from hone.rl.outcomes import prompt_outcomes
from hone.rl.replay import ReplayBuffer, is_replayed
from hone.rollout.base import Interruptible
from hone.rollout.batcher import Batcher
from hone.rollout.episodes import EpisodeKind, Model, play, play_sync
from hone.rollout.multiturn import ENV_ERRORS
from hone.rollout.prompts import episode_kind as prompt_kind
from hone.seeding import derive_seed
from hone.types import Rollout, Sample, SamplingParams

log = logging.getLogger("hone")


@dataclass(frozen=True, kw_only=True)
class PromptBatch:
    """The prompts of one RL step: `step` seeds their sampling (and names them on resume)."""

    step: int
    samples: list[Sample]
    # Which share of the step's prompts this is, when producers split a step (Ray sampler actors): every
    # part gets its own sampling seed. Part 0 is seeded as a whole step, so one producer samples as ever.
    part: int = 0


@dataclass(kw_only=True)
class ScoredGroups:
    """One step's scored rollouts after the filters, grouped (a group's members are adjacent and share
    `group_id`), each stamped with its `policy_version`; the producer's metrics; and `new_tokens`, every
    token sampled for them, filtered-out rollouts included (throughput); `outcomes`, each prompt's
    (correct, scored) rollouts before the filters (the curriculum's pass rates); `sampled`, the first
    `logging.samples` rollouts as sampled, before the filters (what `samples.jsonl` shows)."""

    step: int
    rollouts: list[Rollout]
    metrics: dict[str, float]
    new_tokens: int
    outcomes: dict[str, tuple[int, int]] = field(default_factory=dict)
    sampled: list[Rollout] = field(default_factory=list)


def drop_failed_rewards(rollouts: list[Rollout]) -> tuple[list[Rollout], float]:
    """Keep rollouts whose every reward component answered: one that raised or timed out scored 0 for
    the infrastructure's sake, not the response's, and training on it as a wrong answer would push the
    policy away from slow-to-verify responses. Only that rollout goes: the rest of its group keep their
    grades, and group baselines (GRPO mean/std, RLOO) are taken over the members that remain."""
    kept = [r for r in rollouts if not reward_failed(r)]
    return kept, 1.0 - len(kept) / max(1, len(rollouts))


def drop_zero_variance_groups(rollouts: list[Rollout]) -> tuple[list[Rollout], float]:
    """Keep only groups whose rewards differ (DAPO's dynamic sampling filter; `Producer.refill` refills)."""
    kept = [r for group in grouped(rollouts) if len({x.reward for x in group}) > 1 for r in group]
    return kept, 1.0 - len(kept) / max(1, len(rollouts))


def sampling_params(rollout: RolloutConfig, run_seed: int, step: int, part: int = 0) -> SamplingParams:
    """The training sampling parameters of `step` (seeded by the run's seed, the step and the part)."""
    seed = derive_seed(run_seed, "sampling", step)
    if part:
        seed = derive_seed(seed, "sampling-part", part)
    return SamplingParams(
        n=rollout.n,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=rollout.max_new_tokens,
        stop=rollout.stop,
        seed=seed,
    )


@dataclass(frozen=True, kw_only=True)
class ProducerSettings:
    """What a producer reads of the recipe: the run's seed, the rollout and data sections (sampling, the
    prompt's chat template), dynamic sampling, and the filters. `of(cfg)` is the one place that maps a
    recipe onto it."""

    seed: int
    rollout: RolloutConfig
    data: DataConfig
    dynamic_sampling: DynamicSamplingConfig
    skip_zero_variance_groups: bool
    max_failed_steps: int
    drop_void_turns: bool
    log_samples: int = 0  # `logging.samples`: the first this many rollouts go with the step, unfiltered

    @classmethod
    def of(cls, cfg: HoneConfig) -> ProducerSettings:
        return cls(
            seed=cfg.run.seed,
            rollout=cfg.rollout,
            data=cfg.data,
            dynamic_sampling=cfg.algorithm.dynamic_sampling,
            skip_zero_variance_groups=cfg.algorithm.skip_zero_variance_groups,
            max_failed_steps=cfg.reward.max_failed_steps,
            drop_void_turns=cfg.env.drop_void_turns,
            log_samples=cfg.logging.samples,
        )


def episode_kind(parts: ProducerParts, data: DataConfig) -> EpisodeKind:
    """How the run plays its samples, chosen once: the agent's episodes (`rollout.agent`), one
    environment episode per rollout (`env.name`), or single-turn generation."""
    return prompt_kind(
        parts.agent, parts.episodes, parts.tokenizer, data.chat_template, data.system_prompt, parts.processor
    )


def collect_rollouts(
    parts: ProducerParts, data: DataConfig, samples: list[Sample], params: SamplingParams
) -> list[Rollout]:
    """The run's episodes of `samples`, unscored (failed agent episodes are dropped)."""
    kind = episode_kind(parts, data)
    return play_sync(parts.sampler, parts.tokenizer, kind, samples, params, processor=parts.processor)[0]


def episode_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """Means over the batch of every `episode/*` and `env/*` rollout metric (0 where a rollout lacks it)."""
    names = {k for r in rollouts for k in r.metrics if k.startswith(("episode/", "env/"))}
    return {k: sum(r.metrics.get(k, 0.0) for r in rollouts) / len(rollouts) for k in sorted(names)}


class Producer:
    """Turns a `PromptBatch` into `ScoredGroups` with the run's sampler, reward and environment."""

    def __init__(
        self, parts: ProducerParts, settings: ProducerSettings, replay: ReplayBuffer | None = None
    ) -> None:
        self.parts = parts
        self.settings = settings
        self.replay = replay  # `algorithm.replay`: past successes mixed into groups before the filters
        self.kind = episode_kind(parts, settings.data)

    def interrupt(self) -> None:
        """End the generate call running now, from another thread, where the engine allows it
        (`Interruptible`): the share being produced fails at once instead of finishing."""
        if isinstance(self.parts.sampler, Interruptible):
            self.parts.sampler.interrupt()

    def produce(self, prompts: PromptBatch) -> ScoredGroups:
        """Sample, score and filter one step's prompts: its episodes, their scoring and any refill
        rounds run on one event loop, through one batcher in front of the sampler."""
        return run_serving(lambda engine: self._produce(prompts, engine))

    async def _produce(self, prompts: PromptBatch, engine: Executor) -> ScoredGroups:
        params = sampling_params(self.settings.rollout, self.settings.seed, prompts.step, prompts.part)
        # TRL-contract rewards read the step as `trainer_state` (a scorer here, or on reward workers)
        state = getattr(self.parts.reward, "trainer_state", None)
        if isinstance(state, TrainerState):
            state.global_step = prompts.step
        timing = {"time/sample_s": 0.0, "time/reward_s": 0.0}
        if self.replay is not None:
            self.replay.begin(prompts.step)
        # The processor (a vision-language model's) turns environment images into the model's inputs.
        model = Model(Batcher(self.parts.sampler, pool=engine), self.parts.tokenizer, self.parts.processor)
        try:
            rollouts, metrics = await self._sample_and_score(model, prompts.samples, params, timing)
            metrics |= rollout_metrics(rollouts)  # of what was sampled: replayed rollouts are not
            outcomes = prompt_outcomes(rollouts)  # for the curriculum: the sampled answers, before replay
            sampled = rollouts[: self.settings.log_samples]
            self._mix(rollouts)
            kept, filtered = self.filter(prompts.step, rollouts)
            metrics |= filtered
            new_tokens = sum(r.response_len for r in rollouts)
            if self.settings.dynamic_sampling.enabled:
                kept, refilled, refill_tokens = await self.refill(model, prompts, params, kept, timing)
                metrics |= refilled
                new_tokens += refill_tokens
        finally:
            await model.batcher.aclose()
        if self.replay is not None:
            metrics["replay/frac"] = sum(map(is_replayed, kept)) / max(1, len(kept))
        metrics |= timing
        return ScoredGroups(
            step=prompts.step,
            rollouts=kept,
            metrics=metrics,
            new_tokens=new_tokens,
            outcomes=outcomes,
            sampled=sampled,
        )

    async def _sample_and_score(
        self, model: Model, samples: list[Sample], params: SamplingParams, timing: dict[str, float]
    ) -> tuple[list[Rollout], dict[str, float]]:
        """Play `samples` with `params` and score them; the times add to `timing`. In multi-turn
        episodes a `RewardScorer` scores each episode's rollouts as soon as it ends, so slow verifiers
        overlap the sampling of the episodes still playing. Single-turn episodes all end on the same
        generate call, so there is nothing to overlap: starting their scoring early only has the reward
        threads contend for the GIL with the event loop ending the rest (measured on the demo: +8 ms a
        step), so they are scored after, as other scorers (the Ray back-end's reward workers) are."""
        t0 = time.perf_counter()
        by_id = {s.id: s for s in samples}
        reward = self.parts.reward
        scoring = reward.round(by_id) if isinstance(reward, RewardScorer) else None
        on_done = scoring.submit if scoring is not None and self.kind.multi_turn else None
        rollouts, failed = await play(model, self.kind, samples, params, on_done=on_done)
        t_sample = time.perf_counter()
        if scoring is not None:
            metrics = await scoring.finish(rollouts)
        else:
            metrics = score_rollouts(rollouts, by_id, reward)
        timing["time/sample_s"] += t_sample - t0
        timing["time/reward_s"] += time.perf_counter() - t_sample
        return rollouts, metrics | failed

    def _mix(self, rollouts: list[Rollout]) -> None:
        """Replay stored successes into their prompts' groups (before the filters: a group of fresh
        failures plus a replayed success has a gradient)."""
        if self.replay is not None:
            self.replay.mix(rollouts)

    async def refill(
        self,
        model: Model,
        prompts: PromptBatch,
        params: SamplingParams,
        kept: list[Rollout],
        timing: dict[str, float],
    ) -> tuple[list[Rollout], dict[str, float], int]:
        """DAPO's dynamic sampling (Yu et al. 2025, §3.2): while the step has fewer groups with differing
        rewards than it has prompts, sample another round of prompts, at most `max_rounds` times; keep
        the first groups that fill it, numbered 0.. in the order sampled. Returns them, the `groups/*`
        metrics and the tokens the extra rounds sampled.

        A round's prompts and sampling seed are functions of the step's sampling seed (`params.seed`:
        run seed, step, part) and the round, drawn from the training set apart from the `PromptStream`:
        the stream's later steps stay as they were, and a resumed run refills a step exactly as an
        unbroken one (same prompts, seeds and weights: all rounds run in the producer's one weight hold).
        A round draws as many prompts as the keep rate so far says will fill the step (at least the
        missing count, at most a step's worth), so a step whose groups mostly survive costs one small
        round, not a whole extra batch."""
        target, rounds = len(prompts.samples), self.settings.dynamic_sampling.max_rounds
        assert params.seed is not None  # `sampling_params` always seeds a training step
        seed = params.seed
        groups = grouped(kept)
        sampled, extra, new_tokens, pool = target, 0, 0, self.parts.train_samples
        while len(groups) < target and extra < rounds:
            extra += 1
            missing = target - len(groups)
            draw = min(target, math.ceil(missing * sampled / len(groups))) if groups else target
            picks = random.Random(derive_seed(seed, "refill-prompts", extra)).sample(
                range(len(pool)), min(draw, len(pool))
            )
            round_params = replace(params, seed=derive_seed(seed, "refill-sampling", extra))
            rollouts, _ = await self._sample_and_score(model, [pool[i] for i in picks], round_params, timing)
            sampled += len(picks)
            new_tokens += sum(r.response_len for r in rollouts)
            self._mix(rollouts)
            groups += grouped(self.filter(prompts.step, rollouts, observe=False)[0])
        groups = groups[:target]
        for i, group in enumerate(groups):
            for r in group:
                r.group_id = i
        short = target - len(groups)
        if short and extra:
            log.warning(
                "RL step %d: %d of %d groups have uniform rewards after %d extra sampling rounds "
                "(algorithm.dynamic_sampling.max_rounds); training on %d",
                prompts.step + 1,
                short,
                target,
                extra,
                len(groups),
            )
        metrics = {"groups/resampled": float(sampled - target), "groups/attempts": float(1 + extra)}
        return [r for group in groups for r in group], metrics | {"groups/short": float(short)}, new_tokens

    def filter(
        self, step: int, rollouts: list[Rollout], *, observe: bool = True
    ) -> tuple[list[Rollout], dict[str, float]]:
        """Drop what must not be trained on: failed rewards and environments, void turns (if set), uniform
        groups (if set).
        `observe`: count the step toward the reward-outage streak (once a step: not its refill rounds)."""
        settings = self.settings
        metrics: dict[str, float] = {}
        rollouts, metrics["reward/excluded_frac"] = drop_failed_rewards(rollouts)
        # An episode its environment's error ended (`env/errors`, a server down?) is no grade either.
        rollouts = [r for r in rollouts if not r.metrics.get(ENV_ERRORS)]
        # Every reward failed (a judge down?): the step trains on nothing. Warn once; stop after a streak.
        if observe:
            self.parts.reward.outage.observe(step, metrics["reward/excluded_frac"], settings.max_failed_steps)
        if self.parts.episodes is not None and settings.drop_void_turns:
            kept = [r for r in rollouts if not r.metrics.get("episode/void_turns")]
            metrics["episode/void_dropped_frac"] = 1 - len(kept) / max(1, len(rollouts))
            rollouts = kept
        if settings.skip_zero_variance_groups or settings.dynamic_sampling.enabled:
            rollouts, metrics["groups/skipped_frac"] = drop_zero_variance_groups(rollouts)
        return rollouts, metrics


def grouped(rollouts: list[Rollout]) -> list[list[Rollout]]:
    """`rollouts` split into their groups, in order of first appearance."""
    by_group: dict[int, list[Rollout]] = {}
    for r in rollouts:
        by_group.setdefault(r.group_id, []).append(r)
    return list(by_group.values())


def rollout_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """Episode means, response lengths, the top-answer share and, for multi-turn episodes, the collapse
    diagnostics (`hone.rl.collapse`) of everything sampled (before filters)."""
    n = len(rollouts)
    return (
        episode_metrics(rollouts)
        | collapse_metrics(rollouts)
        | {
            "response_length/mean": sum(r.response_len for r in rollouts) / n,
            "response_length/clip_frac": sum(r.finish_reason == "length" for r in rollouts) / n,
            "answers/top_share": top_answer_share([r.response_text for r in rollouts]),
        }
    )
