"""Reward functions that recipes in the tests import by dotted path (`tests.rewards_for_tests:...`)."""

from __future__ import annotations

import time

from hone.types import Rollout, Sample


def fails_on_odd_length(rollout: Rollout, sample: Sample) -> float:
    if rollout.response_len % 2:
        raise RuntimeError("verifier crashed")
    return 1.0


def token_id_reward(rollout: Rollout, sample: Sample) -> float:
    """Varies within almost every group of a random model, so every step has a gradient."""
    return float(sum(rollout.response_ids) % 7)


def slow_token_id_reward(rollout: Rollout, sample: Sample) -> float:
    """`token_id_reward` after 0.2 s: a producer that is busy scoring when a run is interrupted."""
    time.sleep(0.2)
    return token_id_reward(rollout, sample)


def digit_share_reward(rollout: Rollout, sample: Sample) -> float:
    """The share of digits in the response: ~4% for a random tiny model, and GRPO raises it in a few steps."""
    text = rollout.response_text
    return sum(c.isdigit() for c in text) / max(1, len(text))
