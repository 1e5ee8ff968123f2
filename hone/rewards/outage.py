"""A reward outage: training steps in a row on which every rollout's reward failed."""

from __future__ import annotations

import logging

from hone.errors import HoneError

logger = logging.getLogger(__name__)


class RewardOutageError(HoneError, RuntimeError):
    """Every rollout's reward failed on `reward.max_failed_steps` training steps in a row."""


class OutageWatch:
    """Training steps in a row on which every rollout's reward failed (a judge down, a sandbox that
    cannot start). Such a step trains on nothing, since failed rewards are left out of the loss: the
    first one is a warning, and `limit` in a row stop the run rather than spend its budget idling."""

    def __init__(self) -> None:
        self.streak = 0
        self.warned = False

    def observe(self, step: int, excluded_frac: float, limit: int) -> None:
        """Record RL step `step` (0-based), whose `excluded_frac` of rollouts had a failed reward."""
        if excluded_frac < 1.0:
            self.streak = 0
            return
        self.streak += 1
        if self.streak >= limit:
            raise RewardOutageError(
                f"stopped at RL step {step + 1}: every rollout's reward failed (error or timeout, or every "
                f"TRL reward returned None) on "
                f"{self.streak} steps in a row (reward.max_failed_steps), so nothing was trained; "
                "the first failure is in the log. Fix the reward (a judge or sandbox down?) and resume"
            )
        if not self.warned:
            self.warned = True
            logger.warning(
                "RL step %d: every rollout's reward failed (error or timeout); the step trains on "
                "nothing. The run stops after reward.max_failed_steps=%d such steps in a row",
                step + 1,
                limit,
            )
