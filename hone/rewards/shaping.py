"""Shaping rewards that look at a response's form, not its correctness: format, overlong, length.

- `format`: 1 when the whole response matches a regex, by default DeepSeek-R1's `<think>…</think>`
  then `<answer>…</answer>` layout (Guo et al. 2025, "DeepSeek-R1", §2.2.2 format reward; TinyZero's
  `format_reward` is the same check). Departs from TinyZero's `<think>.*?</think>…` pattern in rejecting
  nested or repeated tags, which that pattern accepts (`<think>a</think><think>b</think><answer>…`) and a
  policy learns to exploit.
- `overlong`: DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), exactly as written:
  0 up to `max_len - buffer` tokens, then linear down to -1 at `max_len`, and -1 beyond.
- `length`: a plain per-token penalty above a target length, `-min(cap, coef * max(0, len - target))`.
  Not Kimi k1.5's length reward (Kimi Team 2025, §2.3.3), which is group-relative (it needs the min and
  max length of the group, which a per-rollout reward does not see) and treats correct and incorrect
  answers differently; this one is the simple, predictable alternative.

Lengths are in response tokens (`rollout.response_len`), as in DAPO, so they match `max_new_tokens`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hone.rewards.registry import register_reward
from hone.types import Rollout, Sample

# Text between tags may not contain another think/answer tag, so nesting and repetition fail to match.
_NO_TAG = r"(?:(?!</?(?:think|answer)>).)*"
DEFAULT_FORMAT_PATTERN = rf"<think>{_NO_TAG}</think>\s*<answer>{_NO_TAG}</answer>"


@register_reward("format")
def format_reward(
    pattern: str = DEFAULT_FORMAT_PATTERN, strip: bool = True
) -> Callable[[Rollout, Sample], float]:
    """1.0 when the whole response (surrounding whitespace stripped unless `strip=False`) fully matches
    `pattern` (compiled with `re.DOTALL`, so `.` spans lines), else 0.0. An invalid regex raises
    `ValueError` here, when the recipe is built, not on the first rollout.
    """
    try:
        regex = re.compile(pattern, re.DOTALL)
    except re.error as err:
        raise ValueError(f"format reward: invalid regex {pattern!r}: {err}") from err

    def reward(rollout: Rollout, sample: Sample) -> float:
        text = rollout.response_text.strip() if strip else rollout.response_text
        return 1.0 if regex.fullmatch(text) else 0.0

    return reward


def overlong_penalty(length: int, max_len: int, buffer: int) -> float:
    """DAPO eq. 13: 0 if `length <= max_len - buffer`; `(max_len - buffer - length) / buffer` up to
    `max_len` (so -1 exactly at `max_len`); -1 beyond it.
    """
    _check_overlong_args(max_len, buffer)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    threshold = max_len - buffer
    if length <= threshold:
        return 0.0
    if length <= max_len:
        return (threshold - length) / buffer
    return -1.0


def _check_overlong_args(max_len: int, buffer: int) -> None:
    if max_len <= 0:
        raise ValueError(f"overlong: max_len must be > 0, got {max_len}")
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong: buffer must be in (0, max_len={max_len}], got {buffer}")


@register_reward("overlong")
def overlong_reward(max_len: int, buffer: int) -> Callable[[Rollout, Sample], float]:
    """DAPO's soft overlong punishment on the response's token count. Set `max_len` to the sampler's
    `max_new_tokens` (DAPO: L_max = 20480, L_cache = 4096) and add it to the task reward with `compose`.
    """
    _check_overlong_args(max_len, buffer)

    def reward(rollout: Rollout, sample: Sample) -> float:
        return overlong_penalty(rollout.response_len, max_len, buffer)

    return reward


def length_penalty(length: int, target: int, coef: float, cap: float) -> float:
    """`-min(cap, coef * max(0, length - target))`: 0 up to `target` tokens, then linear, floored at -cap."""
    excess = max(0, length - target)
    return -min(cap, coef * excess) if excess else 0.0  # `if`: no -0.0 in the logs


@register_reward("length")
def length_reward(
    target: int = 1024, coef: float = 0.001, cap: float = 1.0
) -> Callable[[Rollout, Sample], float]:
    """Penalise each response token above `target`. Defaults: 0.001 per token, reaching the cap of -1 (the
    size of a 0/1 correctness reward) 1000 tokens past a 1024-token target.
    """
    if target < 0:
        raise ValueError(f"length: target must be >= 0, got {target}")
    if coef < 0 or cap < 0:
        raise ValueError(f"length: coef and cap must be >= 0, got coef={coef}, cap={cap}")

    def reward(rollout: Rollout, sample: Sample) -> float:
        return length_penalty(rollout.response_len, target, coef, cap)

    return reward
