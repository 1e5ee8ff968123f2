"""Per-prompt outcomes of a step, for the curriculum's pass-rate tracking (`hone.data.curriculum`)."""

from __future__ import annotations

from hone.data.passrates import Outcome
from hone.rewards import is_correct, reward_failed
from hone.types import Rollout


def prompt_outcomes(rollouts: list[Rollout]) -> dict[str, Outcome]:
    """{sample id: (correct, scored)} over every rollout sampled, before any filter: the groups a
    zero-variance filter drops (all right, all wrong) are exactly what the difficulty estimate needs.
    Correct is what `eval/accuracy` counts (the correctness component at full marks); a rollout whose
    reward failed says nothing about the prompt and is not counted."""
    out: dict[str, Outcome] = {}
    for r in rollouts:
        correct, scored = out.get(r.sample_id, (0, 0))
        if reward_failed(r):
            out[r.sample_id] = (correct, scored)
        else:
            out[r.sample_id] = (correct + is_correct(r), scored + 1)
    return out
