"""Held-out evaluation: greedy accuracy and sampled pass@k of the current policy on a task."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from hone.algorithms import pass_at_k
from hone.algorithms.metrics import check_pass_at_ks
from hone.config import HoneConfig
from hone.orchestration.components import RunComponents
from hone.orchestration.prompts import episode_kind
from hone.rewards import CORRECTNESS, RewardFn, RewardScorer, score_rollouts, top_answer_share
from hone.rollout import Sampler
from hone.rollout.agent import AgentEpisodes
from hone.rollout.episodes import play_sync
from hone.rollout.multiturn import Episodes
from hone.types import Rollout, Sample, SamplingParams

# A response is correct when its correctness component (see `RewardScorer`) earns full marks:
# shaping terms (an overlong penalty, a format bonus) move its reward, not its correctness.
CORRECT_AT = 1.0 - 1e-6


def is_correct(rollout: Rollout) -> bool:
    return rollout.metrics[CORRECTNESS] >= CORRECT_AT


def evaluate(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    samples: Sequence[Sample],
    reward: RewardScorer | RewardFn,
    params: SamplingParams,
    *,
    chat_template: bool = False,
    system_prompt: str | None = None,
    ks: Sequence[int] = (1,),
    episodes: Episodes | None = None,
    agent: AgentEpisodes | None = None,
) -> dict[str, float]:
    """`eval/accuracy` (share of all samples whose correctness component earns full marks),
    `eval/reward`, `eval/pass@k` for each k ≤ n, and `eval/top_answer_share` (the share of responses
    giving the most common answer: collapse shows here).

    With `params.n == 1` and temperature 0 this is greedy accuracy; pass@k uses the unbiased estimator
    over `params.n` samples per problem. With `episodes` (an environment factory and limits) every
    sample is played as a multi-turn episode and scored the same way, and `eval/correct_in_<k>_turns`
    splits the accuracy by how many assistant turns the correct episodes took (with an environment that
    ends at success, that is the turn that solved it: what retrying or reading observations adds).
    With `agent` (`rollout.agent`) the agent plays them instead: an episode that failed counts as wrong
    (and in `eval/env/errors`), and one whose requests split into several sequences is scored by its last.
    """
    check_pass_at_ks(ks, params.n)
    kind = episode_kind(agent, episodes, tokenizer, chat_template, system_prompt)  # as training's
    rollouts, played = play_sync(sampler, tokenizer, kind, samples, params, last_only=True)
    failed = {f"eval/{k}": v for k, v in played.items()}  # agent episodes that failed (eval/env/errors)
    metrics = score_rollouts(rollouts, {s.id: s for s in samples}, reward)
    correct = [0] * len(samples)
    for r in rollouts:
        correct[r.group_id] += is_correct(r)
    n = params.n
    out = {
        "eval/accuracy": sum(correct) / (n * len(samples)),
        "eval/reward": metrics["reward/mean"],
        "eval/errors": metrics["reward/errors"],
        "eval/response_length": sum(r.response_len for r in rollouts) / len(rollouts),
        "eval/top_answer_share": top_answer_share([r.response_text for r in rollouts]),
    }
    if kind.multi_turn:
        by_turns = Counter(len(r.turns) for r in rollouts if is_correct(r))
        for turns in range(1, max((len(r.turns) for r in rollouts), default=0) + 1):
            out[f"eval/correct_in_{turns}_turns"] = by_turns[turns] / len(rollouts)
    out |= failed  # agent episodes that failed (eval/env/errors): counted wrong above
    for k in ks:
        out[f"eval/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(samples)
    return out


@dataclass(frozen=True)
class EvalSettings:
    """What the held-out eval reads from a recipe (`EvalSettings.of`): its sampling and prompt format."""

    params: SamplingParams
    chat_template: bool
    system_prompt: str | None
    ks: list[int]

    @classmethod
    def of(cls, cfg: HoneConfig) -> EvalSettings:
        params = SamplingParams(
            n=cfg.eval.n,
            temperature=cfg.eval.temperature,
            max_new_tokens=cfg.rollout.max_new_tokens,
            stop=cfg.rollout.stop,
            seed=cfg.run.seed,
        )
        return cls(params, cfg.data.chat_template, cfg.data.system_prompt, list(cfg.eval.k))


def run_eval(parts: RunComponents, settings: EvalSettings) -> dict[str, float]:
    """Held-out accuracy (and pass@k) of the run's sampler: `evaluate` with the recipe's eval settings."""
    return evaluate(
        parts.sampler,
        parts.policy.tokenizer,
        parts.eval_samples,
        parts.reward,
        settings.params,
        chat_template=settings.chat_template,
        system_prompt=settings.system_prompt,
        ks=settings.ks,
        episodes=parts.episodes,
        agent=parts.agent,
    )
