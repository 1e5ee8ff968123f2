"""TRL-contract reward functions that recipes in the tests import by dotted path
(`tests.trl_rewards_for_tests:...`): the examples of TRL's GRPOTrainer docs, as written there."""

from __future__ import annotations

import asyncio
import re
from typing import Any


def reward_len(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL docs: reward completions close to 20 characters."""
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL docs: a format reward on conversational completions."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions: list[Any], ground_truth: list[str], **kwargs: Any) -> list[float]:
    """TRL docs: a reward reading the dataset column `ground_truth`."""
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth, strict=True)]


def math_len_reward(completions: list[Any], task: list[str], **kwargs: Any) -> list[float | None]:
    """TRL docs' multi-task pattern: None for the rows of another task."""
    return [float(len(c)) if t == "math" else None for c, t in zip(completions, task, strict=True)]


def code_reward(completions: list[Any], task: list[str], **kwargs: Any) -> list[float | None]:
    return [
        (1.0 if "def " in c else 0.0) if t == "code" else None for c, t in zip(completions, task, strict=True)
    ]


async def async_len_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """An `async def` reward (TRL awaits it)."""
    await asyncio.sleep(0.01)
    return [float(len(c)) for c in completions]


def trl_token_reward(
    completion_ids: list[list[int]], trainer_state: Any, log_metric: Any, log_extra: Any, **kwargs: Any
) -> list[float]:
    """`token_id_reward` of `tests.rewards_for_tests` written TRL's way, logging a metric and a column."""
    rewards = [float(sum(ids) % 7) for ids in completion_ids]
    log_metric("trl_test/step", float(trainer_state.global_step))
    log_extra("parity", ["odd" if int(r) % 2 else "even" for r in rewards])
    return rewards


def wrong_length(completions: list[Any], **kwargs: Any) -> list[float]:
    return [1.0] * (len(completions) + 1)


def neither(x: Any) -> float:
    """Fits neither contract: one positional parameter, no **kwargs."""
    return 0.0
