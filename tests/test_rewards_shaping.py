"""Shaping rewards: the format regex, DAPO's overlong punishment on every branch, the length penalty."""

from __future__ import annotations

import pytest

from hone.rewards.registry import REWARDS
from hone.rewards.shaping import (
    DEFAULT_FORMAT_PATTERN,
    format_reward,
    length_penalty,
    length_reward,
    overlong_penalty,
    overlong_reward,
)
from hone.types import Rollout, Sample

SAMPLE = Sample("s", prompt="q")


def rollout(text: str = "", length: int = 0) -> Rollout:
    """A rollout with a 2-token prompt and `length` response tokens."""
    return Rollout("s", 0, [9, 9] + [5] * length, 2, [1] * length, [0.0] * length, response_text=text)


def test_registered_names_build_the_rewards() -> None:
    assert REWARDS["format"] is format_reward
    assert REWARDS["overlong"] is overlong_reward
    assert REWARDS["length"] is length_reward
    assert REWARDS["overlong"](max_len=10, buffer=4)(rollout(length=10), SAMPLE) == -1.0


@pytest.mark.parametrize(
    "text",
    [
        "<think>2+2 is 4</think><answer>4</answer>",
        "  \n<think>multi\nline\nreasoning</think>\n\n<answer>4</answer>\n ",
        "<think></think><answer></answer>",
        "<think>a < b and b > c</think> <answer>x</answer>",
    ],
)
def test_default_format_accepts_think_then_answer(text: str) -> None:
    assert format_reward()(rollout(text), SAMPLE) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<answer>4</answer>",  # missing think
        "<think>reasoning</think>",  # missing answer
        "<think>reasoning</think><answer>4",  # unclosed answer
        "<answer>4</answer><think>reasoning</think>",  # wrong order
        "So: <think>r</think><answer>4</answer>",  # text before the tags
        "<think>r</think><answer>4</answer> done",  # text after the tags
        "<think>r</think> between <answer>4</answer>",  # text between the tags
        "<think>a<think>b</think></think><answer>4</answer>",  # nested think
        "<think>a</think><think>b</think><answer>4</answer>",  # repeated think
        "<think>a</think><answer>4</answer><answer>5</answer>",  # repeated answer
        "<think>a</think><answer>4<answer>5</answer></answer>",  # nested answer
        "<think>a</answer><answer>4</answer>",  # stray closing tag inside think
    ],
)
def test_default_format_rejects_malformed_responses(text: str) -> None:
    assert format_reward()(rollout(text), SAMPLE) == 0.0


def test_format_strip_can_be_turned_off() -> None:
    text = " <think>r</think><answer>4</answer>"
    assert format_reward(strip=False)(rollout(text), SAMPLE) == 0.0
    assert format_reward(strip=True)(rollout(text), SAMPLE) == 1.0


def test_custom_format_pattern_must_match_the_whole_response() -> None:
    boxed = format_reward(pattern=r".*\\boxed\{[^{}]+\}")
    assert boxed(rollout("so the answer is \\boxed{42}"), SAMPLE) == 1.0
    assert boxed(rollout("so \\boxed{42} is it"), SAMPLE) == 0.0  # fullmatch, not search
    assert boxed(rollout("line one\nline two \\boxed{7}"), SAMPLE) == 1.0  # DOTALL
    assert format_reward(pattern=DEFAULT_FORMAT_PATTERN)(rollout("<think></think><answer>1</answer>"), SAMPLE)


def test_invalid_regex_fails_when_the_reward_is_built() -> None:
    with pytest.raises(ValueError, match=r"invalid regex '<think>\('"):
        format_reward(pattern="<think>(")


# DAPO eq. 13 with L_max = 20, L_cache = 5: zero up to 15 tokens, linear to -1 at 20, -1 beyond.
@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),
        (10, 0.0),
        (15, 0.0),  # boundary |y| = L_max - L_cache: still no penalty
        (16, -0.2),  # (15 - 16) / 5
        (17, -0.4),
        (18, -0.6),
        (19, -0.8),
        (20, -1.0),  # boundary |y| = L_max: the linear branch reaches -1 exactly
        (21, -1.0),
        (1000, -1.0),
    ],
)
def test_overlong_penalty_matches_dapo_eq13(length: int, expected: float) -> None:
    assert overlong_penalty(length, max_len=20, buffer=5) == pytest.approx(expected, abs=1e-12)
    assert overlong_reward(max_len=20, buffer=5)(rollout(length=length), SAMPLE) == pytest.approx(
        expected, abs=1e-12
    )


def test_overlong_with_buffer_equal_to_max_len_is_linear_from_zero() -> None:
    assert [overlong_penalty(n, 4, 4) for n in range(6)] == [0.0, -0.25, -0.5, -0.75, -1.0, -1.0]


@pytest.mark.parametrize(
    ("max_len", "buffer", "message"),
    [
        (0, 1, "max_len must be > 0"),
        (-5, 1, "max_len must be > 0"),
        (10, 0, r"buffer must be in \(0, max_len=10\]"),
        (10, -1, r"buffer must be in \(0, max_len=10\]"),
        (10, 11, r"buffer must be in \(0, max_len=10\]"),
    ],
)
def test_overlong_rejects_bad_arguments(max_len: int, buffer: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        overlong_reward(max_len=max_len, buffer=buffer)
    with pytest.raises(ValueError, match=message):
        overlong_penalty(1, max_len, buffer)


def test_overlong_penalty_rejects_negative_length() -> None:
    with pytest.raises(ValueError, match="length must be >= 0"):
        overlong_penalty(-1, 10, 2)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (100, 0.0), (101, -0.01), (150, -0.5), (200, -1.0), (250, -1.5), (251, -1.5), (10_000, -1.5)],
)
def test_length_penalty_is_linear_above_target_and_capped(length: int, expected: float) -> None:
    assert length_penalty(length, target=100, coef=0.01, cap=1.5) == pytest.approx(expected)
    assert length_reward(target=100, coef=0.01, cap=1.5)(rollout(length=length), SAMPLE) == pytest.approx(
        expected
    )


def test_length_reward_defaults_and_no_negative_zero() -> None:
    reward = length_reward()
    assert str(reward(rollout(length=1024), SAMPLE)) == "0.0"
    assert reward(rollout(length=1524), SAMPLE) == pytest.approx(-0.5)
    assert reward(rollout(length=2024), SAMPLE) == pytest.approx(-1.0)
    assert reward(rollout(length=5000), SAMPLE) == -1.0


@pytest.mark.parametrize("kwargs", [{"target": -1}, {"coef": -0.1}, {"cap": -1.0}])
def test_length_reward_rejects_negative_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="length:"):
        length_reward(**kwargs)
