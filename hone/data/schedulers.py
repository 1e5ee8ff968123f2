"""Prompt schedulers: which training prompts each RL step draws (`data.scheduler`).

`uniform` is the seeded epoch shuffle runs always used (`PromptStream`); `difficulty` is a curriculum
that prefers prompts of intermediate estimated pass rate; a user scheduler is any class with the
`PromptScheduler` protocol, named by a dotted path.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hone.data.passrates import CoolDown, Outcome, PassRates
from hone.plugins import load_object
from hone.registry import Registry
from hone.types import Sample


class PromptStream:
    """Epochs over the training samples, each in a seeded shuffled order.

    `batch(step)` is a pure function of (seed, step): a resumed run draws exactly the prompts an
    uninterrupted run would, with no iterator state to save.
    """

    def __init__(self, samples: Sequence[Sample], batch_size: int, seed: int) -> None:
        if not samples:
            raise ValueError("no training samples")
        self.samples = list(samples)
        self.batch_size = batch_size
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.samples)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._orders = {epoch: order}  # only the current epoch is ever needed again
        return self._orders[epoch]

    def at(self, i: int) -> Sample:
        """The `i`-th prompt of the endless sequence of shuffled epochs."""
        n = len(self.samples)
        return self.samples[self._order(i // n)[i % n]]

    def batch(self, step: int) -> list[Sample]:
        start = step * self.batch_size
        return [self.at(i) for i in range(start, start + self.batch_size)]


@dataclass
class SchedulerContext:
    """What a scheduler is built with: the prompts, how many a step takes, the run's seed, the shared
    pass-rate estimates (updated before `observe` is called) and the difficulty filter (None when off)."""

    samples: list[Sample]
    batch_size: int
    seed: int
    rates: PassRates
    cooldown: CoolDown | None


class PromptScheduler(Protocol):
    """A prompt scheduler, built as `cls(ctx, **data.scheduler_args)`.

    `next_batch(step)` is called once per step, in step order, and returns `ctx.batch_size` samples;
    `observe(step, outcomes)` follows with the step's results in step order ({sample id: (correct,
    scored)}). In async mode a step's batch is drawn before the results of the previous
    `cluster.max_staleness` steps are observed. `state_dict()` (JSON-serialisable) goes into every
    checkpoint and `load_state_dict` restores it, so a resumed run draws what an unbroken one would:
    any randomness must come from the state or from (seed, step).
    """

    def next_batch(self, step: int) -> list[Sample]: ...

    def observe(self, step: int, outcomes: Mapping[str, Outcome]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class _Walk:
    """The uniform order, walked with a cursor so that prompts on cool-down can be passed over."""

    def __init__(self, ctx: SchedulerContext) -> None:
        self.ctx = ctx
        self.stream = PromptStream(ctx.samples, ctx.batch_size, ctx.seed)
        self.cursor = 0

    def take(self, count: int, step: int) -> list[Sample]:
        """The next `count` prompts not on cool-down at `step`. After a whole epoch's worth passed over,
        the rest are taken anyway: a run whose prompts are all cooling down goes on rather than stall."""
        taken: list[Sample] = []
        passed_over = 0
        cooldown = self.ctx.cooldown
        while len(taken) < count:
            sample = self.stream.at(self.cursor)
            self.cursor += 1
            if cooldown and passed_over < len(self.ctx.samples) and cooldown.skipped(sample.id, step):
                passed_over += 1
                continue
            taken.append(sample)
        return taken


class UniformScheduler:
    """`PromptStream` exactly when the difficulty filter is off (the same prompts as every earlier run);
    with the filter, the same order with the prompts on cool-down passed over."""

    def __init__(self, ctx: SchedulerContext) -> None:
        self.walk = _Walk(ctx)

    def next_batch(self, step: int) -> list[Sample]:
        if self.walk.ctx.cooldown is None:
            return self.walk.stream.batch(step)
        return self.walk.take(self.walk.ctx.batch_size, step)

    def observe(self, step: int, outcomes: Mapping[str, Outcome]) -> None:
        """Uniform draws ignore results (the filter, if on, has already seen them)."""

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.walk.cursor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.walk.cursor = int(state["cursor"])


class DifficultyScheduler:
    """Prompts of intermediate estimated pass rate, where a group's rewards differ most (the variance of
    a pass/fail reward, p(1 − p), peaks at p = 0.5): PCL (Prompt Curriculum Learning, Gao et al. 2025)
    picks, from a pool of candidates, the prompts whose predicted pass rate is nearest a target of 0.5;
    PACED-RL likewise steers sampling toward intermediate difficulty. PCL predicts with a value model;
    this uses the tracked per-prompt pass rates (`PassRates`).

    Each step draws `pool × batch_size` fresh candidates from the uniform order, and takes the `fresh`
    share of its batch from them (as PCL does with its whole batch), so the set keeps being measured; the
    rest of the batch is the best of all candidates, fresh or tracked, so a known intermediate prompt is
    drawn again rather than once an epoch (without the fresh share, a few dozen tracked prompts near the
    target would be drawn forever and nothing new measured). Prompts on cool-down are not candidates.
    "Best" is nearest the target: a tracked prompt by |p − target|, an unseen one by |prior − target|
    when its sample carries a prior (`meta_prior`) and otherwise by E|U − target| for U uniform on
    [0, 1] (0.25 at a target of 0.5), so a tracked prompt within that distance beats an unknown one.
    Ties are broken by a draw seeded by (seed, step).

    The target is lowered (the difficulty aimed at raised) as the policy improves: estimates lag the
    policy, so the pass rate the chosen batches actually get (an EMA over steps, weight `ema`) runs above
    the target once the policy outgrows them; the target is then `target − adapt · (that rate − target)`,
    floored at `target_min`.
    """

    def __init__(
        self,
        ctx: SchedulerContext,
        *,
        target: float = 0.5,
        pool: int = 4,
        fresh: float = 0.5,
        adapt: float = 0.5,
        target_min: float = 0.2,
        ema: float = 0.2,
    ) -> None:
        if not 0.0 <= target_min <= target <= 1.0:
            raise ValueError(f"need 0 <= target_min <= target <= 1, got {target_min}, {target}")
        if pool < 1:
            raise ValueError(f"pool must be >= 1, got {pool}")
        if not 0.0 <= fresh <= 1.0:
            raise ValueError(f"fresh must be in [0, 1], got {fresh}")
        self.fresh = fresh
        self.ctx, self.walk = ctx, _Walk(ctx)
        self.base, self.pool, self.adapt, self.target_min, self.ema = target, pool, adapt, target_min, ema
        self.batch_pass: float | None = None  # EMA of the pass rate the chosen batches got
        self._by_id = {s.id: s for s in ctx.samples}

    def target(self) -> float:
        if self.batch_pass is None:
            return self.base
        return max(self.target_min, self.base - self.adapt * max(0.0, self.batch_pass - self.base))

    def _distance(self, sample: Sample, target: float) -> float:
        rates = self.ctx.rates
        if rates.seen(sample) or "pass_rate_prior" in sample.meta:
            return abs(rates.get(sample) - target)
        return (target**2 + (1.0 - target) ** 2) / 2.0

    def next_batch(self, step: int) -> list[Sample]:
        cooldown, size = self.ctx.cooldown, self.ctx.batch_size
        fresh = {s.id: s for s in self.walk.take(self.pool * size, step)}
        candidates = dict(fresh)
        for sample_id in self.ctx.rates.rates:
            if not (cooldown and cooldown.skipped(sample_id, step)):
                candidates.setdefault(sample_id, self._by_id[sample_id])
        target, rng = self.target(), random.Random(f"{self.ctx.seed}/difficulty/{step}")
        keys = {i: (self._distance(s, target), rng.random()) for i, s in candidates.items()}
        batch = sorted(fresh, key=keys.__getitem__)[: math.ceil(self.fresh * size)]
        rest = sorted(set(candidates) - set(batch), key=keys.__getitem__)
        ranked = batch + rest[: size - len(batch)]
        # Fewer distinct candidates than the batch (a data set smaller than a step): repeat, as epochs do.
        return [candidates[ranked[k % len(ranked)]] for k in range(size)]

    def observe(self, step: int, outcomes: Mapping[str, Outcome]) -> None:
        scored = [(k, n) for k, n in outcomes.values() if n]
        if not scored:
            return
        rate = sum(k / n for k, n in scored) / len(scored)
        before = rate if self.batch_pass is None else self.batch_pass
        self.batch_pass = (1 - self.ema) * before + self.ema * rate

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.walk.cursor, "batch_pass": self.batch_pass}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.walk.cursor = int(state["cursor"])
        self.batch_pass = state["batch_pass"]


SCHEDULERS: Registry[type] = Registry("scheduler")
SCHEDULERS.add("uniform", UniformScheduler)
SCHEDULERS.add("difficulty", DifficultyScheduler)


def resolve_scheduler(spec: str) -> type:
    """The class `data.scheduler` names (a built-in name or `pkg.mod:Class`); a one-line `ValueError`
    naming the key otherwise."""
    if spec in SCHEDULERS:
        return SCHEDULERS[spec]
    if ":" not in spec:
        raise ValueError(
            f"data.scheduler: unknown scheduler {spec!r}; built-in: {', '.join(sorted(SCHEDULERS))}, "
            "or a dotted path 'pkg.mod:Class'"
        )
    target = load_object(spec, what="data.scheduler")
    if not isinstance(target, type):
        raise ValueError(f"data.scheduler: {spec!r} is a {type(target).__name__}, not a class")
    return target
