"""Held-out evaluation: greedy accuracy and sampled pass@k of the current policy on a task."""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase
from transformers.processing_utils import ProcessorMixin

from hone.algorithms import pass_at_k
from hone.config import HoneConfig, check_pass_at_ks
from hone.errors import HoneError
from hone.rewards import (
    RewardFn,
    RewardScorer,
    is_correct,
    reward_failed,
    score_rollouts,
    top_answer_share,
)
from hone.rl.components import EvalParts
from hone.rollout import Sampler
from hone.rollout.agent import AgentEpisodes
from hone.rollout.episodes import play_sync
from hone.rollout.multiturn import ENV_ERRORS, Episodes
from hone.rollout.prompts import episode_kind
from hone.types import Rollout, Sample, SamplingParams


def failed(rollout: Rollout) -> bool:
    """A rollout that is no grade: its reward raised or timed out, or its environment raised."""
    return reward_failed(rollout) or bool(rollout.metrics.get(ENV_ERRORS))


@dataclass
class EvalResult:
    """An eval's metrics and the rollouts they were computed from (each scored, in sample order)."""

    metrics: dict[str, float]
    rollouts: list[Rollout]


def evaluate(*args: Any, **kwargs: Any) -> dict[str, float]:
    """The metrics of `evaluate_rollouts` (which see; the same arguments)."""
    return evaluate_rollouts(*args, **kwargs).metrics


def evaluate_rollouts(
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
    processor: ProcessorMixin | None = None,
    accuracy: bool = True,
) -> EvalResult:
    """`eval/accuracy` (share of the scored responses whose correctness component earns full marks),
    `eval/reward` (their mean reward), `eval/pass@k` for each k ≤ n, and `eval/top_answer_share` (the
    share of responses giving the most common answer: collapse shows here); and the rollouts.

    Failures are counted, not graded: a response whose reward raised (`eval/errors`, the failed calls) or
    timed out (`eval/timeouts`), or an episode its environment or agent failed (`eval/env/errors`), says
    nothing about the model, so it is left out of accuracy, reward and pass@k, as training leaves it out
    of the loss. `eval/scored` is how many responses they are over; with none (every one failed) they are
    NaN, not 0. pass@k of a problem uses its scored samples (a problem with fewer than k is left out).

    With `params.n == 1` and temperature 0 this is greedy accuracy; pass@k uses the unbiased estimator
    over `params.n` samples per problem. With `episodes` (an environment factory and limits) every
    sample is played as a multi-turn episode and scored the same way, and `eval/correct_in_<k>_turns`
    splits the accuracy by how many assistant turns the correct episodes took (with an environment that
    ends at success, that is the turn that solved it: what retrying or reading observations adds).
    With `agent` (`rollout.agent`) the agent plays them instead (a failed episode has no response), and
    one whose requests split into several sequences is scored by its last.

    Without `accuracy` (a dataset with no answer column and no reward that grades correctness:
    `EvalParts.accuracy`) there is nothing to be right about: accuracy, pass@k and
    `eval/correct_in_<k>_turns` are left out, and the reward is the eval's measure.
    """
    check_pass_at_ks(ks, params.n)
    kind = episode_kind(agent, episodes, tokenizer, chat_template, system_prompt, processor)  # as training's
    rollouts, played = play_sync(
        sampler, tokenizer, kind, samples, params, last_only=True, processor=processor
    )
    metrics = score_rollouts(rollouts, {s.id: s for s in samples}, reward)
    graded = [r for r in rollouts if not failed(r)]
    scored, correct = [0] * len(samples), [0] * len(samples)
    for r in graded:
        scored[r.group_id] += 1
        correct[r.group_id] += is_correct(r)
    nan = float("nan")
    out = {
        "eval/accuracy": sum(correct) / len(graded) if graded else nan,
        "eval/reward": sum(r.reward for r in graded) / len(graded) if graded else nan,
        "eval/scored": float(len(graded)),
        "eval/errors": metrics["reward/errors"],
        "eval/timeouts": metrics["reward/timeouts"],
        "eval/response_length": sum(r.response_len for r in rollouts) / max(1, len(rollouts)),
        "eval/top_answer_share": top_answer_share([r.response_text for r in rollouts]),
    }
    if kind.multi_turn:
        env_failed = sum(bool(r.metrics.get(ENV_ERRORS)) for r in rollouts)
        out["eval/env/errors"] = env_failed + played.get(ENV_ERRORS, 0.0)  # an agent's: no rollout
        by_turns = Counter(len(r.turns) for r in graded if is_correct(r))
        for turns in range(1, max((len(r.turns) for r in rollouts), default=0) + 1):
            out[f"eval/correct_in_{turns}_turns"] = by_turns[turns] / len(graded) if graded else nan
    out |= {f"eval/{k}": v for k, v in played.items() if k != ENV_ERRORS}  # e.g. eval/env/timeouts
    for k in ks:
        problems = [(v, c) for v, c in zip(scored, correct, strict=True) if v >= k]
        out[f"eval/pass@{k}"] = (
            sum(pass_at_k(v, c, k) for v, c in problems) / len(problems) if problems else nan
        )
    if not accuracy:
        out = {k: v for k, v in out.items() if not k.startswith(GRADED_KEYS)}
    return EvalResult(out, rollouts)


# The eval metrics that count correct responses: left out when nothing grades correctness.
GRADED_KEYS = ("eval/accuracy", "eval/pass@", "eval/correct_in_")


def eval_line(metrics: dict[str, float]) -> str:
    """ "accuracy 0.250" for the log; "reward 0.412" for an eval without accuracy (no answer column)."""
    if "eval/accuracy" in metrics:
        return f"accuracy {metrics['eval/accuracy']:.3f}"
    return f"reward {metrics.get('eval/reward', float('nan')):.3f}"


class RewardBrokenError(HoneError, RuntimeError):
    """Every reward call of an eval raised: a bug in the reward (an outage times out), so a run that
    went on would train on nothing."""


def check_rewards_answered(
    result: EvalResult, reward: RewardScorer | RewardFn, what: str, errors_dir: Path | None = None
) -> None:
    """Raise `RewardBrokenError` (one line) when every one of `result`'s rollouts had a reward component
    raise; the first error's traceback goes to `errors_dir/reward.txt` when given (and is in the log)."""
    rollouts = result.rollouts
    if not rollouts or not all(r.metrics.get("reward/error") for r in rollouts):
        return
    error = getattr(reward, "last_error", None)
    detail, where = "", "the traceback is in the log above"
    if error is not None:
        detail = f": {type(error).__name__}: {error}"
        if errors_dir is not None:
            errors_dir.mkdir(parents=True, exist_ok=True)
            (errors_dir / "reward.txt").write_text("".join(traceback.format_exception(error)))
            where = f"traceback in {errors_dir / 'reward.txt'}"
    raise RewardBrokenError(
        f"reward raised on every one of the {len(rollouts)} {what} samples (a bug in the reward, not an "
        f"outage){detail}; {where}"
    )


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


def run_eval(parts: EvalParts, settings: EvalSettings) -> dict[str, float]:
    """Held-out accuracy (and pass@k) of the run's sampler: `evaluate` with the recipe's eval settings."""
    return run_eval_rollouts(parts, settings).metrics


def run_eval_rollouts(parts: EvalParts, settings: EvalSettings) -> EvalResult:
    """`run_eval`, with the rollouts."""
    return evaluate_rollouts(
        parts.sampler,
        parts.tokenizer,
        parts.eval_samples,
        parts.reward,
        settings.params,
        chat_template=settings.chat_template,
        system_prompt=settings.system_prompt,
        ks=settings.ks,
        episodes=parts.episodes,
        agent=parts.agent,
        processor=parts.processor,
        accuracy=parts.accuracy,
    )
