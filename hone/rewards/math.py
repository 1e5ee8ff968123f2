"""`reward.fn: math`: the math answer checker (`hone.verifiers.math`, whose docstring has the rules)
as a reward on a rollout and its sample."""

from __future__ import annotations

from collections.abc import Callable

from hone.rewards.registry import register_reward
from hone.types import Rollout, Sample
from hone.verifiers.math import math_reward, require_math_verify


@register_reward("math")
def math_verifier(
    answer_field: str | None = None, require_evaluated: bool = False
) -> Callable[[Rollout, Sample], float]:
    """`reward.fn: math`: `math_reward` of the response against `sample.answer`, or against
    `sample.meta[answer_field]` when `answer_field` is given. A sample without a reference raises
    `ValueError` naming it (the runner scores it 0 and counts the error). `require_evaluated` as in
    `math_reward`; a task can turn it on for its problems (`Task.reward_args`).
    """
    if not isinstance(require_evaluated, bool):
        raise ValueError(f"require_evaluated must be true or false, got {require_evaluated!r}")
    require_math_verify()  # a missing dependency fails when the recipe is built, not on every rollout

    def reward(rollout: Rollout, sample: Sample) -> float:
        reference = _sample_reference(sample, answer_field)
        return math_reward(rollout.response_text, reference, require_evaluated=require_evaluated)

    return reward


def _sample_reference(sample: Sample, answer_field: str | None) -> str:
    value = sample.answer if answer_field is None else sample.meta.get(answer_field)
    if value is None or not str(value).strip():
        where = "answer" if answer_field is None else f"meta[{answer_field!r}]"
        raise ValueError(f"math reward: sample {sample.id!r} has no reference answer in {where}")
    return str(value)  # references loaded from JSON may be numbers
