"""Reward layer: in-place scoring that survives failing reward functions, and weighted composition."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time

import pytest

from hone.data import Arithmetic
from hone.rewards import (
    CORRECTNESS,
    RewardComponent,
    RewardScorer,
    Score,
    as_score,
    own_time_budget,
    reward_failed,
    score_rollouts,
    task_reward,
)
from hone.types import Rollout, Sample


def rollout(sample_id: str, text: str) -> Rollout:
    return Rollout(sample_id, 0, [5, 6, 7], 2, [1], [-0.1], response_text=text)


SAMPLES = {"a": Sample("a", prompt="1+1=", answer="2"), "b": Sample("b", prompt="2+2=", answer="4")}


def exact(r: Rollout, s: Sample) -> float:
    return float(r.response_text == s.answer)


def short(r: Rollout, s: Sample) -> Score:
    return Score(1.0 if len(r.response_text) <= 1 else 0.0, {"chars": float(len(r.response_text))})


def test_score_rollouts_fills_rewards_in_place_and_reports_means() -> None:
    rollouts = [rollout("a", "2"), rollout("b", "5"), rollout("b", "44")]
    metrics = score_rollouts(rollouts, SAMPLES, short)
    assert [(r.reward, r.reward_parts) for r in rollouts] == [
        (1.0, {"chars": 1.0}),
        (1.0, {"chars": 1.0}),
        (0.0, {"chars": 2.0}),
    ]
    assert metrics == {
        "reward/errors": 0.0,
        "reward/timeouts": 0.0,
        "reward/mean": pytest.approx(2 / 3),
        "reward/chars": pytest.approx(4 / 3),
    }


def test_failing_or_invalid_rewards_score_zero_and_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    def flaky(r: Rollout, s: Sample) -> Score | float:
        if r.response_text == "boom":
            raise RuntimeError("verifier crashed")
        return {"nan": math.nan, "none": None, "part": Score(1.0, {"x": math.inf})}.get(r.response_text, 1.0)

    rollouts = [rollout("a", t) for t in ["ok", "boom", "nan", "none", "part", "ok"]]
    rollouts[1].reward, rollouts[1].reward_parts = 7.0, {"stale": 1.0}
    with caplog.at_level(logging.WARNING, logger="hone.rewards.scoring"):
        metrics = score_rollouts(rollouts, SAMPLES, flaky)
    assert [r.reward for r in rollouts] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert rollouts[1].reward_parts == {}
    assert rollouts[1].metrics == {"reward/error": 1.0, "reward/correctness": 0.0}
    assert "reward/error" not in rollouts[0].metrics
    assert metrics["reward/errors"] == 4.0 and metrics["reward/mean"] == pytest.approx(2 / 6)
    assert (
        len(caplog.records) == 1 and "verifier crashed" in caplog.text
    )  # first failure only, with traceback


def test_unknown_sample_id_is_a_caller_bug_not_a_reward_error() -> None:
    with pytest.raises(KeyError, match="unknown sample id 'zzz'"):
        score_rollouts([rollout("zzz", "2")], SAMPLES, exact)


def test_components_weight_values_and_keep_unweighted_named_parts() -> None:
    scorer = RewardScorer([RewardComponent("correct", exact, 1.0), RewardComponent("brevity", short, 0.5)])
    rollouts = [rollout("a", "2"), rollout("a", "22"), rollout("b", "3")]
    metrics = scorer.score(rollouts, SAMPLES)
    assert [r.reward for r in rollouts] == [1.5, 0.0, 0.5]
    assert rollouts[0].reward_parts == {"correct": 1.0, "brevity": 1.0, "brevity/chars": 1.0}
    assert rollouts[1].reward_parts == {"correct": 0.0, "brevity": 0.0, "brevity/chars": 2.0}
    assert metrics["reward/correct"] == pytest.approx(1 / 3) and metrics["reward/brevity"] == pytest.approx(
        2 / 3
    )
    with pytest.raises(ValueError, match="at least one"):
        RewardScorer([])
    with pytest.raises(ValueError, match="unique"):
        RewardScorer([RewardComponent("x", exact), RewardComponent("x", short)])
    with pytest.raises(ValueError, match="weight of 'x' is not finite"):
        RewardScorer([RewardComponent("x", exact, math.nan)])


def test_a_failing_component_scores_zero_alone_and_the_others_still_count() -> None:
    def broken(r: Rollout, s: Sample) -> float:
        raise RuntimeError("judge down")

    scorer = RewardScorer([RewardComponent("correct", exact, 1.0), RewardComponent("judge", broken, 0.5)])
    rollouts = [rollout("a", "2")]
    metrics = scorer.score(rollouts, SAMPLES)
    assert rollouts[0].reward == 1.0 and rollouts[0].reward_parts == {"correct": 1.0, "judge": 0.0}
    assert metrics["reward/errors"] == 1.0 and rollouts[0].metrics["reward/error"] == 1.0


def test_sync_and_async_calls_that_outlive_their_timeout_score_zero_and_are_counted() -> None:
    release = threading.Event()

    def hangs(r: Rollout, s: Sample) -> float:
        if r.response_text == "hang":
            release.wait(30)  # a stuck verifier thread: abandoned, never joined
        return 1.0

    async def slow(r: Rollout, s: Sample) -> float:
        if r.response_text == "hang":
            await asyncio.sleep(30)
        return 1.0

    try:
        for fn in (hangs, slow):
            rollouts = [rollout("a", "ok"), rollout("a", "hang"), rollout("b", "ok")]
            started = time.monotonic()
            metrics = RewardScorer(fn, timeout_s=0.3).score(rollouts, SAMPLES)
            assert time.monotonic() - started < 5
            assert [r.reward for r in rollouts] == [1.0, 0.0, 1.0]
            assert metrics["reward/timeouts"] == 1.0 and metrics["reward/errors"] == 0.0
            assert rollouts[1].metrics == {"reward/timeout": 1.0, "reward/correctness": 0.0}
    finally:
        release.set()


def test_async_rewards_run_concurrently_up_to_the_limit() -> None:
    # Every call waits until 4 calls are in flight at once: run one at a time, they would all time out.
    in_flight, peak, lock = 0, 0, threading.Lock()
    everyone_here = threading.Barrier(4, timeout=5)

    def meet(r: Rollout, s: Sample) -> float:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        everyone_here.wait()
        time.sleep(0.05)
        with lock:
            in_flight -= 1
        return 1.0

    rollouts = [rollout("a", str(i)) for i in range(12)]
    metrics = RewardScorer(meet, timeout_s=10, max_concurrency=4).score(rollouts, SAMPLES)
    assert metrics["reward/mean"] == 1.0 and metrics["reward/timeouts"] == 0.0
    assert peak == 4


def test_a_batched_component_is_called_once_for_the_whole_batch() -> None:
    class LengthModel:
        calls = 0

        def score_batch(self, rollouts: list[Rollout], samples: list[Sample]) -> list[float]:
            LengthModel.calls += 1
            return [len(r.response_text) / 10 for r in rollouts]

    scorer = RewardScorer([RewardComponent("rm", LengthModel(), 2.0), RewardComponent("correct", exact)])
    rollouts = [rollout("a", "2"), rollout("b", "4444")]
    scorer.score(rollouts, SAMPLES)
    assert LengthModel.calls == 1
    assert [r.reward for r in rollouts] == [pytest.approx(1.2), pytest.approx(0.8)]


def test_task_reward_adapts_a_task_verifier() -> None:
    reward = task_reward(Arithmetic())
    assert reward(rollout("a", "2\nextra"), SAMPLES["a"]) == 1.0
    assert reward(rollout("a", "3"), SAMPLES["a"]) == 0.0


def test_as_score_normalises_numbers_and_rejects_non_numbers() -> None:
    assert as_score(True) == Score(1.0) and as_score(Score(1, {"p": 0})) == Score(1.0, {"p": 0.0})
    with pytest.raises(TypeError, match="reward must be a number, got str"):
        as_score("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reward part 'p' is not finite"):
        as_score(Score(1.0, {"p": -math.inf}))


def test_scoring_works_from_inside_a_running_event_loop() -> None:
    async def caller() -> dict[str, float]:  # e.g. a notebook cell, or an async trainer
        return score_rollouts([rollout("a", "2")], SAMPLES, exact)

    assert asyncio.run(caller())["reward/mean"] == 1.0


def test_stop_iteration_and_system_exit_from_a_verifier_are_errors_not_hangs_or_exits() -> None:
    def bad(r: Rollout, s: Sample) -> float:
        if r.response_text == "stop":
            raise StopIteration
        raise SystemExit(1)

    rollouts = [rollout("a", "stop"), rollout("a", "exit")]
    started = time.monotonic()
    metrics = RewardScorer(bad, timeout_s=10).score(rollouts, SAMPLES)
    assert time.monotonic() - started < 5
    assert metrics["reward/errors"] == 2.0 and metrics["reward/timeouts"] == 0.0


def test_the_correctness_component_is_recorded_unweighted_per_rollout() -> None:
    brevity = RewardComponent("brevity", short, 0.5)
    marked = RewardScorer([brevity, RewardComponent("correct", exact, 2.0, correctness=True)])
    rollouts = [rollout("a", "2"), rollout("a", "22")]
    marked.score(rollouts, SAMPLES)
    assert [r.reward for r in rollouts] == [2.5, 0.0]
    assert [r.metrics[CORRECTNESS] for r in rollouts] == [1.0, 0.0]  # not 2.0: the grade, not its weight
    single = RewardScorer([RewardComponent("correct", exact, 3.0)])  # the only component is the grade
    single.score(rollouts, SAMPLES)
    assert [r.metrics[CORRECTNESS] for r in rollouts] == [1.0, 0.0]
    unmarked = RewardScorer([brevity, RewardComponent("correct", exact)])  # none: the total
    unmarked.score(rollouts, SAMPLES)
    assert [r.metrics[CORRECTNESS] for r in rollouts] == [1.5, 0.0]
    with pytest.raises(ValueError, match="only one reward component"):
        RewardScorer(
            [RewardComponent("x", exact, correctness=True), RewardComponent("y", short, correctness=True)]
        )


def test_a_failed_verdict_is_flagged_until_the_rollout_is_scored_again() -> None:
    def broken(r: Rollout, s: Sample) -> float:
        raise RuntimeError("sandbox down")

    rollouts = [rollout("a", "2")]
    score_rollouts(rollouts, SAMPLES, broken)
    assert reward_failed(rollouts[0])
    score_rollouts(rollouts, SAMPLES, exact)
    assert not reward_failed(rollouts[0]) and rollouts[0].reward == 1.0


def test_a_reward_call_knows_its_own_time_budget_under_the_scorer_timeout() -> None:
    """Sync (worker thread), async and batched calls all see their deadline: a verifier stops before
    it and grades the response, since a timed-out call is left out of training instead."""
    seen: dict[str, float | None] = {}

    def sync(rollout: Rollout, sample: Sample) -> float:
        seen["sync"] = own_time_budget()
        return 1.0

    async def async_(rollout: Rollout, sample: Sample) -> float:
        seen["async"] = own_time_budget(cap=1.0)
        return 1.0

    class Batched:
        def score_batch(self, rollouts: list[Rollout], samples: list[Sample]) -> list[float]:
            seen["batch"] = own_time_budget()
            return [1.0] * len(rollouts)

    scorer = RewardScorer(
        [
            RewardComponent("sync", sync),
            RewardComponent("async", async_, timeout_s=20.0),
            RewardComponent("batch", Batched(), timeout_s=4.0),
        ],
        timeout_s=10.0,
    )
    scorer.score([rollout("s1", "x")], {"s1": Sample("s1", prompt="q")})
    # 85% of what is left of each component's timeout (the rest: the verifier's own overheads); a cap wins.
    assert seen["sync"] == pytest.approx(8.5, abs=0.1)
    assert seen["async"] == 1.0
    assert seen["batch"] == pytest.approx(3.4, abs=0.1)
    assert own_time_budget() is None and own_time_budget(cap=2.0) == 2.0  # outside a scorer call


def test_a_round_scores_rollouts_as_they_arrive_with_the_metrics_of_one_batch_score() -> None:
    """What the producer does: each episode's rollouts are submitted as it ends (the slow verifier starts
    at once), the batched component runs once over the step; the metrics equal `score`'s exactly."""

    class LengthModel:
        calls = 0

        def score_batch(self, rollouts: list[Rollout], samples: list[Sample]) -> list[float]:
            LengthModel.calls += 1
            return [len(r.response_text) / 10 for r in rollouts]

    def make() -> tuple[RewardScorer, list[Rollout]]:
        components = [RewardComponent("rm", LengthModel(), 2.0), RewardComponent("short", short)]
        return RewardScorer([*components, RewardComponent("correct", exact)]), [
            rollout("a", "2"),
            rollout("b", "4444"),
            rollout("a", "boom"),
        ]

    scorer, batch = make()
    expected = scorer.score(batch, SAMPLES)
    scorer, rollouts = make()

    async def produce() -> dict[str, float]:
        scoring = scorer.round(SAMPLES)
        scoring.submit(rollouts[1:2])  # an episode that ended first
        await asyncio.sleep(0)
        scoring.submit(rollouts[:1])
        return await scoring.finish(rollouts)  # the third was never submitted: scored here

    LengthModel.calls = 0
    assert asyncio.run(produce()) == expected and LengthModel.calls == 1
    assert [(r.reward, r.reward_parts) for r in rollouts] == [(r.reward, r.reward_parts) for r in batch]
