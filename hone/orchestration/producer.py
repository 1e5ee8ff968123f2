"""The producer: prompts → sample → score → filter → scored, version-stamped groups.

It reads the sampler, the reward and the environment and nothing of the learner: every rollout carries
the weight version that generated it (`Rollout.policy_version`), so whoever trains on a `ScoredGroups`
knows how stale it is. Sampling is seeded by the step the prompts belong to, so producing the same step
again (a resumed run) samples the same rollouts from the same weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hone.config import HoneConfig
from hone.orchestration.components import RunComponents
from hone.orchestration.outcomes import prompt_outcomes
from hone.orchestration.prompts import generation_requests
from hone.rewards import reward_failed, score_rollouts, top_answer_share
from hone.rollout.multiturn import run_episodes
from hone.seeding import derive_seed
from hone.types import Rollout, Sample, SamplingParams


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
    (correct, scored) rollouts before the filters (the curriculum's pass rates)."""

    step: int
    rollouts: list[Rollout]
    metrics: dict[str, float]
    new_tokens: int
    outcomes: dict[str, tuple[int, int]] = field(default_factory=dict)


def drop_failed_rewards(rollouts: list[Rollout]) -> tuple[list[Rollout], float]:
    """Keep rollouts whose every reward component answered: one that raised or timed out scored 0 for
    the infrastructure's sake, not the response's, and training on it as a wrong answer would push the
    policy away from slow-to-verify responses. Only that rollout goes: the rest of its group keep their
    grades, and group baselines (GRPO mean/std, RLOO) are taken over the members that remain."""
    kept = [r for r in rollouts if not reward_failed(r)]
    return kept, 1.0 - len(kept) / max(1, len(rollouts))


def drop_zero_variance_groups(rollouts: list[Rollout]) -> tuple[list[Rollout], float]:
    """Keep only groups whose rewards differ (DAPO's dynamic sampling filter, without resampling)."""
    by_group: dict[int, list[Rollout]] = {}
    for r in rollouts:
        by_group.setdefault(r.group_id, []).append(r)
    kept = [r for group in by_group.values() if len({x.reward for x in group}) > 1 for r in group]
    return kept, 1.0 - len(kept) / max(1, len(rollouts))


def sampling_params(cfg: HoneConfig, step: int, part: int = 0) -> SamplingParams:
    """The training sampling parameters of `step` (seeded by the run's seed, the step and the part)."""
    seed = derive_seed(cfg.run.seed, "sampling", step)
    if part:
        seed = derive_seed(seed, "sampling-part", part)
    return SamplingParams(
        n=cfg.rollout.n,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        max_new_tokens=cfg.rollout.max_new_tokens,
        stop=cfg.rollout.stop,
        seed=seed,
    )


def collect_rollouts(
    parts: RunComponents, cfg: HoneConfig, samples: list[Sample], params: SamplingParams
) -> list[Rollout]:
    """Single-turn generations, or one multi-turn episode per rollout when the run has an environment."""
    if parts.episodes is None:
        requests = generation_requests(samples, parts.policy.tokenizer, cfg.data.chat_template)
        return parts.sampler.generate(requests, params)
    episodes = parts.episodes
    return run_episodes(
        parts.sampler, parts.policy.tokenizer, episodes.make_env, samples, params, episodes.limits
    )


def episode_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """Means over the batch of every `episode/*` and `env/*` rollout metric (0 where a rollout lacks it)."""
    names = {k for r in rollouts for k in r.metrics if k.startswith(("episode/", "env/"))}
    return {k: sum(r.metrics.get(k, 0.0) for r in rollouts) / len(rollouts) for k in sorted(names)}


class Producer:
    """Turns a `PromptBatch` into `ScoredGroups` with the run's sampler, reward and environment."""

    def __init__(self, parts: RunComponents, cfg: HoneConfig) -> None:
        self.parts = parts
        self.cfg = cfg

    def produce(self, prompts: PromptBatch) -> ScoredGroups:
        t0 = time.perf_counter()
        params = sampling_params(self.cfg, prompts.step, prompts.part)
        rollouts = collect_rollouts(self.parts, self.cfg, prompts.samples, params)
        t_sample = time.perf_counter()
        metrics = score_rollouts(rollouts, {s.id: s for s in prompts.samples}, self.parts.reward)
        t_reward = time.perf_counter()
        metrics |= rollout_metrics(rollouts)
        kept, filtered = self.filter(prompts.step, rollouts)
        metrics |= filtered
        metrics["time/sample_s"] = t_sample - t0
        metrics["time/reward_s"] = t_reward - t_sample
        new_tokens = sum(r.response_len for r in rollouts)
        return ScoredGroups(
            step=prompts.step,
            rollouts=kept,
            metrics=metrics,
            new_tokens=new_tokens,
            outcomes=prompt_outcomes(rollouts),
        )

    def filter(self, step: int, rollouts: list[Rollout]) -> tuple[list[Rollout], dict[str, float]]:
        """Drop what must not be trained on: failed rewards, void turns (if set), uniform groups (if set)."""
        cfg = self.cfg
        metrics: dict[str, float] = {}
        rollouts, metrics["reward/excluded_frac"] = drop_failed_rewards(rollouts)
        # Every reward failed (a judge down?): the step trains on nothing. Warn once; stop after a streak.
        self.parts.reward.outage.observe(step, metrics["reward/excluded_frac"], cfg.reward.max_failed_steps)
        if self.parts.episodes is not None and cfg.env.drop_void_turns:
            kept = [r for r in rollouts if not r.metrics.get("episode/void_turns")]
            metrics["episode/void_dropped_frac"] = 1 - len(kept) / max(1, len(rollouts))
            rollouts = kept
        if cfg.algorithm.skip_zero_variance_groups:
            rollouts, metrics["groups/skipped_frac"] = drop_zero_variance_groups(rollouts)
        return rollouts, metrics


def rollout_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """Episode means, response lengths and the top-answer share of everything sampled (before filters)."""
    n = len(rollouts)
    return episode_metrics(rollouts) | {
        "response_length/mean": sum(r.response_len for r in rollouts) / n,
        "response_length/clip_frac": sum(r.finish_reason == "length" for r in rollouts) / n,
        "answers/top_share": top_answer_share([r.response_text for r in rollouts]),
    }
