"""What the built-in games share: train/eval splits by a hash of the problem, and message shapes."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from hone.envs.base import Message
from hone.types import Sample


def is_eval(name: str, key: str, eval_fraction: float) -> bool:
    digest = hashlib.sha256(f"{name}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def draw(
    name: str,
    n: int,
    seed: int,
    split: str,
    make: Callable[[random.Random], tuple[str, Sample]],
    eval_fraction: float = 0.1,
) -> list[Sample]:
    """`n` samples of `split` from `make(rng) -> (split key, sample)`, deterministic in (n, seed)."""
    check_split(split)
    rng = random.Random(f"{name}/{split}/{seed}")
    samples: list[Sample] = []
    for _ in range(1000 * max(n, 1)):
        if len(samples) == n:
            return samples
        key, sample = make(rng)
        if is_eval(name, key, eval_fraction) == (split == "eval"):
            sample.id = f"{name}-{split}-{seed}-{len(samples)}"
            samples.append(sample)
    if len(samples) < n:
        raise ValueError(f"environment {name!r}: the {split} split has too few problems for {n} samples")
    return samples


def check_split(split: str) -> None:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


# --- tool_arithmetic ---


def user_turn(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant_turn(content: str) -> Message:
    return {"role": "assistant", "content": content}
