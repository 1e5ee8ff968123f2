"""Score a batch of rollouts in place, isolating failures of individual reward calls.

Why never raise: one malformed response that trips a verifier must not kill an hours-long run; it
scores 0 and is counted in `reward/errors`, which is visible in the metrics, and the first failure in
each batch is logged with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from hone.rewards.base import RewardFn, as_score
from hone.types import Rollout, Sample

logger = logging.getLogger(__name__)


def score_rollouts(
    rollouts: Sequence[Rollout], samples_by_id: Mapping[str, Sample], reward_fn: RewardFn
) -> dict[str, float]:
    """Set `reward` and `reward_parts` on every rollout; return `reward/errors`, `reward/mean` and
    `reward/<part>` (mean over the rollouts that reported that part).

    A rollout whose sample is missing is a caller bug and raises `KeyError`; a reward function that
    raises or returns a non-finite or non-numeric value gives that rollout reward 0, no parts, and
    `metrics["reward/error"] = 1.0`.
    """
    errors = 0
    part_values: dict[str, list[float]] = {}
    for rollout in rollouts:
        if rollout.sample_id not in samples_by_id:
            raise KeyError(f"rollout refers to unknown sample id {rollout.sample_id!r}")
        try:
            score = as_score(reward_fn(rollout, samples_by_id[rollout.sample_id]))
        except Exception:
            if errors == 0:
                logger.warning(
                    "reward function failed on sample %r; scoring 0", rollout.sample_id, exc_info=True
                )
            errors += 1
            rollout.reward, rollout.reward_parts = 0.0, {}
            rollout.metrics["reward/error"] = 1.0
            continue
        rollout.reward, rollout.reward_parts = score.value, dict(score.parts)
        for name, value in score.parts.items():
            part_values.setdefault(name, []).append(value)
    # Part means first, so that a part called "errors" or "mean" cannot shadow the canonical names.
    metrics = {f"reward/{name}": sum(v) / len(v) for name, v in part_values.items()}
    metrics["reward/errors"] = float(errors)
    if rollouts:
        metrics["reward/mean"] = sum(r.reward for r in rollouts) / len(rollouts)
    return metrics
