"""Score rollouts: weighted reward components, run concurrently, each call under a timeout.

Why never raise: one malformed response that trips a verifier, or one hung LLM-judge request, must
not kill an hours-long run. A component call that raises, returns a non-finite/non-numeric value, or
outlives its timeout contributes 0 for that rollout and is counted in `reward/errors` or
`reward/timeouts`; the first failure of each batch is logged with its traceback. Such a rollout is
flagged (`reward_failed`), so the loop can keep it out of the policy loss: an infrastructure failure
is not a wrong answer.

Correctness: one component may be the reward's correctness (`correctness=True`; otherwise the rule of
`correctness_component`, which `hone.rewards.resolve` applies to a recipe too: a single component is
it). Each rollout's unweighted value of it lands in `rollout.metrics["reward/correctness"]` (the total
reward when there is none), which `eval/accuracy` counts: shaping such as an overlong penalty lowers the
reward a correct answer earns, not whether it is correct.

Concurrency: async reward functions run on one event loop; sync ones each run in a daemon thread
(a thread stuck in, say, a pathological sympy simplification cannot be killed, but it is abandoned at
its timeout and cannot keep the process from exiting). At most `max_concurrency` calls run at once;
the timeout clock of a call starts when the call does, not while it waits for a slot. A batched
component (`score_batch`, e.g. a reward model, or a TRL-contract function: `hone.rewards.trl_contract`,
whose None for a rollout means "does not apply") is one call for the whole batch. A call can read how
long it has left (`own_time_budget`), so a verifier whose slowness is the response's doing (a hanging
program, a sympy blow-up) scores it before the timeout rather than escaping as a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import math
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hone.aio import run_coroutine
from hone.rewards.base import BatchRewardFn, RewardFn, Score, as_score
from hone.rewards.outage import OutageWatch
from hone.rewards.trl_contract import LoggedScores, TrainerState, TrlReward, trl_metrics
from hone.types import Rollout, Sample
from hone.verifiers.budget import call_deadline

logger = logging.getLogger(__name__)

CORRECTNESS = "reward/correctness"  # per-rollout metric: the correctness component's unweighted value
# A response is correct when its correctness component earns full marks: shaping terms (an overlong
# penalty, a format bonus) move its reward, not its correctness.
CORRECT_AT = 1.0 - 1e-6
UNSCORABLE = "reward/unscorable"  # every component is TRL-contract and returned None: no grade
_FAILURE_FLAGS = ("reward/error", "reward/timeout", UNSCORABLE)
# Built-in rewards that grade an answer right or wrong: the default correctness component.
VERIFIER_REWARDS = ("task", "math", "code", "env")


@dataclass
class RewardComponent:
    """One term of the reward: `weight * fn(...)`, logged unweighted as `reward/<name>`."""

    name: str
    fn: RewardFn | BatchRewardFn
    weight: float = 1.0
    timeout_s: float | None = None  # None: the scorer's default
    correctness: bool = False  # this component says whether the answer is right (eval/accuracy)


class _Failure:
    def __init__(self, kind: str, error: BaseException | None = None) -> None:
        self.kind, self.error = kind, error  # kind: "error" | "timeout"


class RewardScorer:
    """Fill `reward` and `reward_parts` of rollouts from weighted components.

    With a single component its own sub-parts are logged as `reward/<part>`; with several, each
    component's unweighted value is `reward/<name>` and its sub-parts `reward/<name>/<part>`.
    """

    def __init__(
        self,
        components: Sequence[RewardComponent] | RewardFn,
        *,
        timeout_s: float = 30.0,
        max_concurrency: int = 16,
    ) -> None:
        if callable(components) or isinstance(components, BatchRewardFn):
            components = [RewardComponent("reward", components)]
        if not components:
            raise ValueError("a reward needs at least one component")
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"reward component names must be unique: {names}")
        for c in components:
            if not math.isfinite(c.weight):
                raise ValueError(f"weight of {c.name!r} is not finite: {c.weight}")
        if max_concurrency < 1 or timeout_s <= 0:
            raise ValueError("max_concurrency must be ≥ 1 and timeout_s > 0")
        marked = [c.name for c in components if c.correctness]
        if len(marked) > 1:
            raise ValueError(f"only one reward component can be the correctness one, got {marked}")
        # A bare callable is not known to be a verifier: mark it, or the total reward is counted.
        self.correctness: str | None = correctness_component(names, marked)
        self.outage = OutageWatch()  # fed by the training loop, one step at a time
        self.last_error: BaseException | None = None  # the first error of the latest batch that had one
        self.components = list(components)
        # What TRL-contract rewards read as `trainer_state`; the producer moves its step.
        self.trainer_state = TrainerState()
        for c in self.components:
            if isinstance(c.fn, TrlReward):
                c.fn.state = self.trainer_state
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency

    def score(self, rollouts: Sequence[Rollout], samples_by_id: Mapping[str, Sample]) -> dict[str, float]:
        """Score in place; return `reward/mean`, `reward/errors`, `reward/timeouts`, `reward/<part>`."""
        for rollout in rollouts:
            if rollout.sample_id not in samples_by_id:
                raise KeyError(f"rollout refers to unknown sample id {rollout.sample_id!r}")
        samples = [samples_by_id[r.sample_id] for r in rollouts]
        results = run_coroutine(self._score_all(rollouts, samples)) if rollouts else []
        return self._combine(rollouts, results)

    def round(self, samples_by_id: Mapping[str, Sample]) -> ScoringRound:
        """Score a step's rollouts as their episodes end (call within the step's event loop)."""
        return ScoringRound(self, samples_by_id)

    async def _score_all(
        self, rollouts: Sequence[Rollout], samples: Sequence[Sample]
    ) -> list[list[Score | _Failure | None]]:
        slots = asyncio.Semaphore(self.max_concurrency)
        per_component = []
        for comp in self.components:
            timeout = comp.timeout_s or self.timeout_s
            if isinstance(comp.fn, BatchRewardFn):
                per_component.append(self._batch(comp.fn, rollouts, samples, timeout, slots))
            else:
                calls = [
                    self._one(comp.fn, r, s, timeout, slots) for r, s in zip(rollouts, samples, strict=True)
                ]
                per_component.append(_gather(calls))
        return list(await asyncio.gather(*per_component))

    async def _one(
        self, fn: RewardFn, rollout: Rollout, sample: Sample, timeout: float, slots: asyncio.Semaphore
    ) -> Score | _Failure:
        async with slots:
            try:
                # One deadline, however the call is made; the call can read it (`own_time_budget`).
                with call_deadline(timeout):
                    async with asyncio.timeout(timeout):
                        if _is_async(fn):
                            result = await fn(rollout, sample)  # type: ignore[misc]
                        else:
                            result = await _in_thread(fn, rollout, sample)
                            if inspect.isawaitable(result):
                                result = await result
                return as_score(result)
            except TimeoutError:
                return _Failure("timeout")
            except Exception as e:
                return _Failure("error", e)

    async def _batch(
        self,
        fn: BatchRewardFn,
        rollouts: Sequence[Rollout],
        samples: Sequence[Sample],
        timeout: float,
        slots: asyncio.Semaphore,
    ) -> list[Score | _Failure | None]:
        async with slots:
            try:
                with call_deadline(timeout):
                    if isinstance(fn, TrlReward) and fn.is_async:
                        values = await asyncio.wait_for(fn.ascore_batch(rollouts, samples), timeout)
                    else:
                        values = await asyncio.wait_for(
                            _in_thread(fn.score_batch, rollouts, samples), timeout
                        )
                if len(values) != len(rollouts):
                    raise ValueError(
                        f"score_batch returned {len(values)} scores for {len(rollouts)} rollouts"
                    )
                if not isinstance(fn, TrlReward):
                    return [as_score(v) for v in values]
                # A TRL reward's None: the function does not apply to this completion (not an error).
                scores = LoggedScores(None if v is None else as_score(v) for v in values)
                scores.metrics, scores.extra = values.metrics, values.extra
                return scores
            except TimeoutError:
                return [_Failure("timeout")] * len(rollouts)
            except Exception as e:
                return [_Failure("error", e)] * len(rollouts)

    def _combine(
        self, rollouts: Sequence[Rollout], results: list[list[Score | _Failure | None]]
    ) -> dict[str, float]:
        errors = timeouts = unscorable = 0
        part_values: dict[str, list[float]] = {}
        single = len(self.components) == 1
        # TRL-contract components: the values each returned (not its Nones), and what the calls logged.
        trl_values: dict[str, list[float]] = {
            c.name: [] for c in self.components if isinstance(c.fn, TrlReward)
        }
        logged: dict[str, float] = {}
        for comp_results in results:
            logged.update(getattr(comp_results, "metrics", {}))
            for column, values in getattr(comp_results, "extra", {}).items():
                for rollout, value in zip(rollouts, values, strict=True):
                    rollout.extra[column] = value
        for i, rollout in enumerate(rollouts):
            total, parts, correctness, answered = 0.0, {}, None, False
            for flag in _FAILURE_FLAGS:  # re-scoring a rollout replaces its verdict
                rollout.metrics.pop(flag, None)
            for comp, comp_results in zip(self.components, results, strict=False):
                score = comp_results[i]
                if score is None:  # a TRL reward that does not apply: left out of the sum and its stats
                    continue
                answered = True
                if isinstance(score, _Failure):
                    if score.kind == "timeout":
                        timeouts += 1
                        rollout.metrics["reward/timeout"] = 1.0
                    else:
                        if errors == 0:
                            self.last_error = score.error
                            logger.warning(
                                "reward %r failed on sample %r; scoring 0",
                                comp.name,
                                rollout.sample_id,
                                exc_info=score.error,
                            )
                        errors += 1
                        rollout.metrics["reward/error"] = 1.0
                    score = Score(0.0)
                elif comp.name in trl_values:
                    trl_values[comp.name].append(score.value)
                total += comp.weight * score.value
                if comp.name == self.correctness:
                    correctness = score.value
                if single:
                    parts.update(score.parts)
                else:
                    parts[comp.name] = score.value
                    parts.update({f"{comp.name}/{sub}": v for sub, v in score.parts.items()})
            if not answered and results:  # every function returned None: no grade (TRL: unscorable)
                unscorable += 1
                rollout.metrics[UNSCORABLE] = 1.0
            rollout.reward, rollout.reward_parts = total, parts
            rollout.metrics[CORRECTNESS] = total if correctness is None else correctness
            for name, value in parts.items():
                part_values.setdefault(name, []).append(value)
        # What TRL rewards logged first, then part means, so that neither can shadow the canonical names.
        metrics = dict(logged)
        metrics |= {f"reward/{name}": sum(v) / len(v) for name, v in part_values.items()}
        metrics |= trl_metrics(trl_values)
        metrics["reward/errors"] = float(errors)
        metrics["reward/timeouts"] = float(timeouts)
        if trl_values:
            metrics["reward/unscorable"] = float(unscorable)
        if rollouts:
            scored = [r for r in rollouts if not r.metrics.get(UNSCORABLE)] if unscorable else rollouts
            metrics["reward/mean"] = sum(r.reward for r in scored) / len(scored) if scored else math.nan
        for rollout in rollouts:  # scored: its environment's instance is let go (`Rollout.env_state`)
            rollout.env_state = None
        return metrics


class ScoringRound:
    """One step's scoring, started rollout by rollout as episodes end, so slow verifiers overlap the
    sampling of the episodes still playing. `finish` waits for them and returns exactly the metrics
    `RewardScorer.score` would on the same rollouts: each call is the same call, and the metrics are
    combined over the rollouts in their order. A batched component (`score_batch`, a reward model) is
    still one call over the whole step, in `finish`: its batch must not depend on which episode ended
    first."""

    def __init__(self, scorer: RewardScorer, samples_by_id: Mapping[str, Sample]) -> None:
        self.scorer, self.samples_by_id = scorer, samples_by_id
        self._slots = asyncio.Semaphore(scorer.max_concurrency)
        # id(rollout) -> one task per per-rollout component (None in a batched component's place)
        self._started: dict[int, list[asyncio.Future[Score | _Failure] | None]] = {}

    def submit(self, rollouts: Sequence[Rollout]) -> None:
        """Start scoring `rollouts` with every per-rollout component."""
        for rollout in rollouts:
            sample = self.samples_by_id.get(rollout.sample_id)
            if sample is None:
                raise KeyError(f"rollout refers to unknown sample id {rollout.sample_id!r}")
            self._started[id(rollout)] = [
                None
                if isinstance(comp.fn, BatchRewardFn)
                else asyncio.ensure_future(
                    self.scorer._one(comp.fn, rollout, sample, self._timeout(comp), self._slots)
                )
                for comp in self.scorer.components
            ]

    def _timeout(self, comp: RewardComponent) -> float:
        return comp.timeout_s or self.scorer.timeout_s

    async def finish(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """Score in place what is not scored yet; the metrics of `RewardScorer.score`."""
        self.submit([r for r in rollouts if id(r) not in self._started])
        if not rollouts:
            return self.scorer._combine(rollouts, [])
        samples = [self.samples_by_id[r.sample_id] for r in rollouts]
        each = [self._started.pop(id(r)) for r in rollouts]
        calls = [
            self.scorer._batch(comp.fn, rollouts, samples, self._timeout(comp), self._slots)
            if isinstance(comp.fn, BatchRewardFn)
            else _gather([tasks[k] for tasks in each])
            for k, comp in enumerate(self.scorer.components)
        ]
        # Batched components run at once, as in `RewardScorer.score` (several TRL rewards of one batch).
        results: list[list[Score | _Failure | None]] = list(await asyncio.gather(*calls))
        return self.scorer._combine(rollouts, results)


def correctness_component(
    names: Sequence[str], marked: Sequence[str], verifiers: Sequence[str] = ()
) -> str | None:
    """Which component `eval/accuracy` counts: the one `marked` as correctness, else the only one, else
    the first of `verifiers` (components made by a built-in reward in `VERIFIER_REWARDS`, which the
    config can name); None means the total reward. One rule for a recipe and the scorer."""
    if marked:
        return marked[0]
    if len(names) == 1:
        return names[0]
    return verifiers[0] if verifiers else None


def is_correct(rollout: Rollout) -> bool:
    """Whether `rollout` is correct (what `eval/accuracy` and the curriculum's pass rates count)."""
    return rollout.metrics[CORRECTNESS] >= CORRECT_AT


def reward_failed(rollout: Rollout) -> bool:
    """Whether a reward component raised or timed out on `rollout` (its reward is then not a grade)."""
    return any(rollout.metrics.get(flag) for flag in _FAILURE_FLAGS)


def score_rollouts(
    rollouts: Sequence[Rollout], samples_by_id: Mapping[str, Sample], reward: RewardScorer | RewardFn
) -> dict[str, float]:
    """Score with `reward` (a scorer, or one reward function with default timeout and concurrency)."""
    # Anything with `score` stands in for a scorer (the Ray back-end's reward workers); else a bare fn.
    scorer = reward if hasattr(reward, "score") else RewardScorer(reward)
    return scorer.score(rollouts, samples_by_id)


async def _gather(calls: Sequence[Any]) -> list[Any]:
    return list(await asyncio.gather(*calls))


def _is_async(fn: object) -> bool:
    call = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


class _DaemonWorkers:
    """Reusable daemon threads (an executor's threads are joined at exit, so one hung verifier would
    hang the process). A worker is started only when none is idle; a hung one is simply never idle
    again, so the pool grows by the number of hung calls and stays at `max_concurrency` otherwise."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # reserve an idle worker for this job
        if spawn:
            threading.Thread(target=self._work, args=(job,), name="hone-reward", daemon=True).start()
        else:
            self._jobs.put(job)

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            job = self._jobs.get()


_workers = _DaemonWorkers()


def _in_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Run `fn(*args)` on a daemon worker thread; the future settles on the calling loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and cancelled meanwhile
            return
        if error is None:
            future.set_result(result)
        elif isinstance(error, StopIteration):  # a future refuses StopIteration itself
            future.set_exception(RuntimeError(f"reward function raised StopIteration: {error}"))
        else:
            future.set_exception(error)

    context = contextvars.copy_context()  # the call's deadline (`own_time_budget`) goes with it

    def job() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(fn, *args), None)
        except Exception as e:
            outcome = (None, e)
        except BaseException as e:  # SystemExit from a verifier must not end the trainer
            outcome = (None, RuntimeError(f"reward function raised {type(e).__name__}: {e}"))
        with contextlib.suppress(RuntimeError):  # a closed loop: the call was abandoned at its timeout
            loop.call_soon_threadsafe(settle, *outcome)

    _workers.submit(job)
    return future
