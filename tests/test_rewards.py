"""Reward layer: in-place scoring that survives failing reward functions, and weighted composition."""

from __future__ import annotations

import logging
import math

import pytest

from hone.data import Arithmetic
from hone.rewards import Score, as_score, compose, score_rollouts, task_reward
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
    assert rollouts[1].reward_parts == {} and rollouts[1].metrics == {"reward/error": 1.0}
    assert "reward/error" not in rollouts[0].metrics
    assert metrics["reward/errors"] == 4.0 and metrics["reward/mean"] == pytest.approx(2 / 6)
    assert (
        len(caplog.records) == 1 and "verifier crashed" in caplog.text
    )  # first failure only, with traceback


def test_unknown_sample_id_is_a_caller_bug_not_a_reward_error() -> None:
    with pytest.raises(KeyError, match="unknown sample id 'zzz'"):
        score_rollouts([rollout("zzz", "2")], SAMPLES, exact)


def test_compose_weights_values_and_keeps_unweighted_named_parts() -> None:
    reward = compose({"correct": (exact, 1.0), "brevity": (short, 0.5)})
    assert reward(rollout("a", "2"), SAMPLES["a"]) == Score(
        1.5, {"correct": 1.0, "brevity": 1.0, "brevity/chars": 1.0}
    )
    assert reward(rollout("a", "22"), SAMPLES["a"]) == Score(
        0.0, {"correct": 0.0, "brevity": 0.0, "brevity/chars": 2.0}
    )
    rollouts = [rollout("a", "2"), rollout("b", "3")]
    metrics = score_rollouts(rollouts, SAMPLES, reward)
    assert [r.reward for r in rollouts] == [1.5, 0.5]
    assert metrics["reward/correct"] == 0.5 and metrics["reward/brevity"] == 1.0
    with pytest.raises(ValueError, match="at least one"):
        compose({})
    with pytest.raises(ValueError, match="weight of 'x' is not finite"):
        compose({"x": (exact, math.nan)})


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
