"""The one rollout source: admission, ordered take, retries and the staleness/idle metrics, over an executor.

The loop drives training through `RolloutSource.take()` alone. `Rollouts` is the one implementation;
where the producing runs is its `Executor` (`rl.placement.executors`: inline, threads;
`rl.placement.ray.executor`: Ray actors), so synchronous, asynchronous and Ray training differ only in
the executor and η (`rl.placement.build` picks them from the recipe):

    sync   = Rollouts(InlineExecutor(producer), ahead=0)       produced inside `take`, in the loop's thread
    async  = Rollouts(ThreadExecutor(k producers), ahead=η)     produced ahead in k threads
    ray    = Rollouts(RayExecutor(k sampler actors), ahead=η)   produced ahead in k actors

Admission (AReaL's rule, a rollout may start only while accepted + running < (η + v + 1)·B, counted in
whole steps of B groups): step s is submitted once the learner has finished s - η steps. A step is then
sampled with the weights after step s - η or later and trained with those after step s - 1, and a
version counts publishes (at most one a step), so staleness (the learner's version when it trains, minus
the rollout's) is at most η; with η = 0 each step is produced after the previous update: synchronous
training. Work is never thrown away: producers idle instead (`time/producer_idle_frac`). Admission is a
function of the step, so a checkpoint needs nothing of it: a resume submits again every step that was in
flight, with its prompts and seed (both functions of the step).

Several producers: a step is split into one share per producer (contiguous runs of whole groups; share k
seeded apart from the others, share 0 as a whole step, so one producer samples exactly what a local run
does), and the shares are merged back in prompt order (`merge_shares`). Chosen over "each producer takes
whole steps" because it is the only one of the two that speeds up η = 0 (on-policy) training, which is
what a cluster of samplers is for: whole steps keep k producers busy only with η ≥ k - 1, buying
throughput with staleness. With η > 0 a producer that finished its share of step s goes on to its share
of step s + 1 while another waits on its slowest response, so the tail overlaps too. The cost: k
producers sample other draws than one (the step's prompts are the same, the seeds differ per share).
`cluster.producer_split: steps` takes the other branch: producer `s mod k` produces all of step s (seeded
as one producer would), so with η ≥ k - 1 the producers sample k different steps at once, and one
step's slowest response holds up only its own producer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from hone.errors import HoneError
from hone.rewards.outage import RewardOutageError
from hone.rl.producer import Producer, PromptBatch, ScoredGroups
from hone.rl.replay import is_replayed
from hone.rollout.fingerprint import WeightMismatchError
from hone.rollout.multiturn import MostEpisodesFailedError
from hone.types import Sample

log = logging.getLogger("hone")


class RolloutSource(Protocol):
    """`take` returns the next step's scored groups, oldest step first (it may block until they are done);
    `publish(version)` makes the learner's current weights that version on every producer; `close` stops
    producing (steps in flight are dropped: a resumed run submits them again). `ahead` is η, how many
    steps past the one the learner takes next may be in flight (set between takes: `max_staleness: auto`)."""

    ahead: int

    def take(self) -> ScoredGroups: ...

    def publish(self, version: int) -> None: ...

    def close(self) -> None: ...


class Pending(Protocol):
    """One share of a step handed to an executor: `result()` blocks until it is produced (raising what
    producing raised), `peek()` is the result if it is already there (else None), without waiting."""

    def result(self) -> ScoredGroups: ...

    def peek(self) -> ScoredGroups | None: ...


class Executor(Protocol):
    """Where producing runs, on `width` producers; the rollout source above owns everything else.

    - `submit(k, prompts)` hands producer k one share of a step and returns at once; producer k produces
      the shares it is given in the order given, each with one weight version held for the whole share
      (a retry included: `produce_with_retries`).
    - `publish(version)` makes the learner's current weights `version` on every producer without waiting
      for a share in progress: each producer installs it before it starts its next share, so every share
      submitted after a publish is sampled with that version or a newer one.
    - `inline`: True when producing happens inside `Pending.result()`, in the caller's thread (nothing
      runs between takes, so there is no staleness, buffer or idle time to measure).
    - `idle_s()`: seconds the producers have spent with nothing to produce, summed over them, since the
      start (None where it is not measured).
    - `close()` stops the producers and frees what the executor started (threads, actors, engines); steps
      in flight are dropped. Every wait inside has a timeout.
    Faults: an error inside producing is retried by the producer (`produce_with_retries`); a producer
    process that dies (Ray) is the executor's to restart, counted in the share's `faults/actor_restarts`.
    """

    inline: bool

    @property
    def width(self) -> int: ...

    def submit(self, k: int, prompts: PromptBatch) -> Pending: ...

    def publish(self, version: int) -> None: ...

    def idle_s(self) -> float | None: ...

    def close(self) -> None: ...


class PromptPlan(Protocol):
    """Which prompts each step trains on, and what it learns from the outcomes (`data.curriculum`)."""

    def batch(self, step: int) -> list[Sample]: ...

    def observe(self, step: int, outcomes: dict[str, tuple[int, int]]) -> dict[str, float]: ...


class ProducerError(HoneError, RuntimeError):
    """A step's producing raised on every attempt (`cluster.producer_retries` + 1); the message is one
    line naming the step and the last error."""


# Deliberate stops, not faults: producing the step again would only repeat them.
_NOT_RETRIED = (RewardOutageError, WeightMismatchError, MostEpisodesFailedError)


def produce_with_retries(
    producer: Producer,
    prompts: PromptBatch,
    retries: int,
    *,
    hold: Callable[[], AbstractContextManager[object]] = nullcontext,
    stopping: threading.Event | None = None,
) -> ScoredGroups:
    """`producer.produce(prompts)` inside `hold()` (the sampler's weights held still: `WeightChannel.hold`;
    a Ray actor needs none, its calls run one at a time), produced again up to `retries` times when it
    raises (a sampler, reward or environment fault: a judge's HTTP 502, a dead sandbox). The hold spans
    every attempt, so a retry samples the same prompts with the same seed (both functions of the step)
    and the same weights as the attempt that failed: a fault that passes leaves the run as if it had
    never happened. The share's `faults/producer_retries` counts its failed attempts. KeyboardInterrupt
    and SystemExit (not `Exception`s) and a reward outage (a deliberate stop) are never retried, nor is
    anything once `stopping` is set (the run is closing); the last failure raises `ProducerError`."""
    failed = 0
    with hold():
        while True:
            try:
                groups = producer.produce(prompts)
            except _NOT_RETRIED:
                raise
            except Exception as e:
                failed += 1
                error = " ".join(f"{type(e).__name__}: {e}".split())  # one line, whatever the message
                if failed > retries or (stopping is not None and stopping.is_set()):
                    attempts = f"{failed} attempt{'s' if failed > 1 else ''}"
                    raise ProducerError(
                        f"stopped at RL step {prompts.step + 1}: producing its rollouts failed on "
                        f"{attempts} (cluster.producer_retries={retries}); last error: {error}"
                    ) from e
                log.warning(
                    "RL step %d: producing its rollouts failed (%s); producing it again (retry %d of %d)",
                    prompts.step + 1,
                    error,
                    failed,
                    retries,
                )
            else:
                groups.metrics["faults/producer_retries"] = float(failed)
                return groups


@dataclass
class _Step:
    shares: list[PromptBatch]
    pending: list[Pending]


class Rollouts:
    """The rollout source: steps `start`..`steps - 1` of `plan`, admitted η = `ahead` steps ahead of the
    learner, produced by `executor`, taken in step order (see the module docstring). `version` is the
    weight version the producers hold at the start (a resumed run's checkpoint's)."""

    def __init__(
        self,
        executor: Executor,
        plan: PromptPlan,
        *,
        start: int,
        steps: int,
        ahead: int,
        version: int,
        whole_steps: bool = False,
    ) -> None:
        self.executor, self.plan, self.ahead, self.steps = executor, plan, ahead, steps
        self.whole_steps = whole_steps  # each step to one producer, in turn (`cluster.producer_split`)
        self.published = version  # the learner's version: staleness is measured against it
        self._submitted = self._taken = start
        self._in_flight: deque[_Step] = deque()
        self._last_take = time.perf_counter()
        self._idle_at_last_take = executor.idle_s() or 0.0

    def _admit(self) -> None:
        """Submit every step the admission rule allows now: up to the one η ahead of the next take."""
        while self._submitted < min(self._taken + self.ahead + 1, self.steps):
            step = self._submitted
            batch = PromptBatch(step=step, samples=self.plan.batch(step))
            if self.whole_steps:
                shares = [batch]
                pending = [self.executor.submit(step % self.executor.width, batch)]
            else:
                shares = split(batch, self.executor.width)
                pending = [self.executor.submit(s.part, s) for s in shares]
            self._in_flight.append(_Step(shares, pending))
            self._submitted += 1

    def take(self) -> ScoredGroups:
        """The next step's groups (blocking), with the curriculum's, staleness, buffer and idle metrics."""
        if self._taken >= self.steps:
            raise RuntimeError(f"take() past the run's last step ({self.steps})")
        self._admit()
        waited = time.perf_counter()
        step = self._in_flight.popleft()
        results = [p.result() for p in step.pending]
        groups = results[0] if len(results) == 1 else merge_shares(step.shares, results)
        self._taken += 1
        if not self.executor.inline:
            groups.metrics |= self._pipeline_metrics(groups, waited)
        groups.metrics |= self.plan.observe(groups.step, groups.outcomes)
        return groups

    def _pipeline_metrics(self, groups: ScoredGroups, waited: float) -> dict[str, float]:
        """How stale the step is, what is buffered behind it, and who waited on whom since the last take."""
        now = time.perf_counter()
        since, self._last_take = max(now - self._last_take, 1e-9), now
        # Replayed successes (`algorithm.replay`) are old on purpose: staleness is of what was sampled.
        lags = [self.published - r.policy_version for r in groups.rollouts if not is_replayed(r)] or [0]
        done = (p.peek() for step in self._in_flight for p in step.pending)
        metrics = {
            "staleness/mean": sum(lags) / len(lags),
            "staleness/max": float(max(lags)),
            # Rollouts a publish landed in (`rollout.interruptible`): sampled by more than one version.
            "staleness/interrupted_frac": sum(bool(r.token_versions) for r in groups.rollouts)
            / max(len(groups.rollouts), 1),
            "buffer/groups": float(sum(len({r.group_id for r in g.rollouts}) for g in done if g is not None)),
            "time/learner_wait_s": now - waited,
            "time/learner_idle_frac": (now - waited) / since,
        }
        idle_total = self.executor.idle_s()
        if idle_total is not None:
            idle = (idle_total - self._idle_at_last_take) / self.executor.width
            self._idle_at_last_take = idle_total
            metrics["time/producer_idle_frac"] = min(idle / since, 1.0)
        return metrics

    def publish(self, version: int) -> None:
        self.published = version
        self.executor.publish(version)

    def close(self) -> None:
        self._in_flight.clear()
        self.executor.close()


def split(prompts: PromptBatch, count: int) -> list[PromptBatch]:
    """The step's prompts (whole groups: a sample is a group) as at most `count` contiguous shares, share
    k numbered `part=k` (its own sampling seed; part 0 is seeded as the whole step)."""
    if count == 1:
        return [prompts]
    size, extra = divmod(len(prompts.samples), count)
    shares, start = [], 0
    for k in range(count):
        end = start + size + (k < extra)
        if end > start:
            shares.append(PromptBatch(step=prompts.step, samples=prompts.samples[start:end], part=k))
        start = end
    return shares


def merge_shares(shares: list[PromptBatch], results: list[ScoredGroups]) -> ScoredGroups:
    """One step's `ScoredGroups` from its shares, in prompt order: group ids (positions within a share)
    shifted by the groups before the share; metrics averaged over the shares weighted by their prompts,
    times the slowest share's, fault counts summed; per-prompt outcomes summed (a prompt drawn twice in
    a step may fall in two shares)."""
    rollouts, offset = [], 0
    metrics: dict[str, float] = {}
    outcomes: dict[str, tuple[int, int]] = {}
    total = sum(len(s.samples) for s in shares)
    for share, result in zip(shares, results, strict=True):
        for r in result.rollouts:
            r.group_id += offset
            rollouts.append(r)
        offset += len(share.samples)
        for sample_id, (correct, scored) in result.outcomes.items():
            before = outcomes.get(sample_id, (0, 0))
            outcomes[sample_id] = (before[0] + correct, before[1] + scored)
        for key, value in result.metrics.items():
            if key.startswith("time/"):
                metrics[key] = max(metrics.get(key, 0.0), value)
            elif key.startswith("faults/"):
                metrics[key] = metrics.get(key, 0.0) + value
            else:
                metrics[key] = metrics.get(key, 0.0) + value * len(share.samples) / total
    return ScoredGroups(
        step=shares[0].step,
        rollouts=rollouts,
        metrics=metrics,
        new_tokens=sum(r.new_tokens for r in results),
        outcomes=outcomes,
        sampled=[r for result in results for r in result.sampled],  # in prompt order: the first N lead
    )
