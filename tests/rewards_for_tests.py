"""Reward functions that recipes in the tests import by dotted path (`tests.rewards_for_tests:...`)."""

from __future__ import annotations

from hone.types import Rollout, Sample


def length_reward(rollout: Rollout, sample: Sample) -> float:
    return float(rollout.response_len)


def fails_on_odd_length(rollout: Rollout, sample: Sample) -> float:
    if rollout.response_len % 2:
        raise RuntimeError("verifier crashed")
    return 1.0
