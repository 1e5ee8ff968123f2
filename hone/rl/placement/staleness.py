"""`cluster.max_staleness: auto`: the admitted staleness η, adjusted online.

A fixed η is a guess in each framework's own units (AReaL's `max_head_offpolicyness`, verl's
`staleness_threshold`, slime's off-by-n): too small and the learner waits on the sampler, too large and
the rollouts drift off-policy until the importance weights degenerate and the reward curve suffers. The
controller reads three signals the run measures at every step anyway:

* `time/learner_idle_frac`, the share of the step the learner waited for rollouts: η buys throughput only
  while the learner waits; once it never does, more η adds staleness and nothing else;
* `offpolicy/ess_seq`, the effective sample size of the step's sequence importance weights (Kish:
  (Σw)² / (n Σw²), w = Π_t π_θ/π_behav over a response's tokens, 1 when on-policy), how far the
  behaviour policies have drifted from the learner. Sequences, not tokens: measured on
  `bench/async_bench.py`, the token ESS stayed at 0.94-0.99 even at η = 8 while naive PPO's reward
  curve fell well below sync's; a sequence's weight compounds its tokens' drift;
* the reward trend: a fast and a slow moving average of `reward/mean`; the fast one falling below the slow one
  by more than half the reward's typical step-to-step deviation says the curve is turning down.

Rule (additive increase, multiplicative decrease, as TCP's congestion window): η halves (rounding down)
when the ESS falls below `ESS_LOW` or the reward turns down; η grows by one, up to
`cluster.max_staleness_cap`, when the learner waited more than `IDLE_HIGH` of the step and the ESS is
above `ESS_HIGH`. A change waits `HOLD` steps after the previous one (its effect shows only after the
steps already in flight). It starts at η = 1. The thresholds are fixed, not tuned per workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ESS_LOW = 0.90
ESS_HIGH = 0.97
IDLE_HIGH = 0.10
HOLD = 3
_FAST, _SLOW = 0.3, 0.05  # the reward averages' weights of a new step


@dataclass
class StalenessController:
    cap: int
    limit: int = 1
    _fast: float | None = field(default=None, init=False)
    _slow: float | None = field(default=None, init=False)
    _deviation: float = field(default=0.0, init=False)
    _since_change: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.limit = min(self.limit, self.cap)

    def update(self, metrics: dict[str, float]) -> int:
        """Read one step's metrics; return η for the steps admitted from now on, and log it and the
        reward trend into `metrics` (`staleness/limit`, `staleness/reward_trend`)."""
        trend = self._reward_trend(metrics.get("reward/mean"))
        ess, idle = metrics.get("offpolicy/ess_seq"), metrics.get("time/learner_idle_frac")
        self._since_change += 1
        if self._since_change > HOLD:
            falling = trend is not None and trend < -0.5 * self._deviation
            if self.limit > 0 and ((ess is not None and ess < ESS_LOW) or falling):
                self._change(self.limit // 2)
            elif (
                self.limit < self.cap
                and idle is not None
                and idle > IDLE_HIGH
                and (ess is None or ess > ESS_HIGH)
            ):
                self._change(self.limit + 1)
        metrics["staleness/limit"] = float(self.limit)
        if trend is not None:
            metrics["staleness/reward_trend"] = trend
        return self.limit

    def _change(self, limit: int) -> None:
        self.limit, self._since_change = limit, 0

    def _reward_trend(self, reward: float | None) -> float | None:
        """The fast reward average less the slow one (None before the first reward)."""
        if reward is None:
            return None
        if self._fast is None or self._slow is None:
            self._fast = self._slow = reward
            return 0.0
        self._deviation += _SLOW * (abs(reward - self._slow) - self._deviation)
        self._fast += _FAST * (reward - self._fast)
        self._slow += _SLOW * (reward - self._slow)
        return self._fast - self._slow
