"""The built-in game `arithmetic_retry`: arithmetic with a few tries ("wrong" after each miss).

See `hone.envs.games` for all the games."""

from __future__ import annotations

import random
from typing import Any

from hone.envs.base import Environment, Message, StepResult, register_env
from hone.envs.games.common import check_split, user_turn
from hone.types import Sample
from hone.verifiers.math import math_reward


@register_env("arithmetic_retry")
class ArithmeticRetry(Environment):
    """`a+b=` with feedback: a wrong answer is told "wrong" and may try again, up to `tries` turns.

    The problems are `hone.data.Arithmetic`'s (same arguments, same hash-based held-out split, so
    evaluation problems are distinct and never trained on). Reward 1.0 for the right value (checked by
    `hone.verifiers.math.math_reward` on the reply: `0412` = `412`, `400+12` refused) in any turn, else 0. The
    smallest multi-turn task that needs its observations: after "wrong", the same answer again is sure
    to fail.
    """

    max_turns = 3

    def __init__(self, tries: int = 3, **task_args: Any) -> None:
        if tries < 1:
            raise ValueError(f"tries must be >= 1, got {tries}")
        self.max_turns = tries
        self.turns = 0
        self.answer = ""

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, tries: int = 3, **task_args: Any) -> list[Sample]:
        check_split(split)
        from hone.data import Arithmetic

        task = Arithmetic(**task_args)
        return task.eval_samples(n, seed) if split == "eval" else task.train_samples(n, seed)

    def reset(self, sample: Sample) -> list[Message]:
        self.turns, self.answer = 0, sample.answer or ""
        return [user_turn(sample.prompt or "")]

    def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        if math_reward(assistant_message, self.answer, require_evaluated=True):
            return StepResult([], reward=1.0, done=True, info={"solved": 1.0})
        return StepResult([user_turn("wrong")], done=self.turns >= self.max_turns)

    def demonstration(self, sample: Sample) -> list[Message]:
        """Half the time the right answer at once; otherwise one or two near misses (one digit off), each
        told "wrong", then the right answer. The misses have weight 0: SFT teaches recovering after
        "wrong" (a fresh, different answer) without teaching the misses themselves."""
        answer = sample.answer or ""
        rng = random.Random(f"arithmetic_retry/{sample.id}")
        misses = min(rng.choice([0, 0, 1, 2]), self.max_turns - 1) if answer.isdigit() else 0
        messages = [user_turn(sample.prompt or "")]
        tried = {answer}
        for _ in range(misses):
            miss = _near_miss(answer, rng, tried)
            tried.add(miss)
            messages += [{"role": "assistant", "content": miss, "weight": 0}, user_turn("wrong")]
        return [*messages, {"role": "assistant", "content": answer}]


def _near_miss(answer: str, rng: random.Random, avoid: set[str]) -> str:
    """`answer` with one digit changed (the kind of slip a small model makes), not in `avoid`."""
    while True:
        at = rng.randrange(len(answer))
        miss = answer[:at] + rng.choice([d for d in "0123456789" if d != answer[at]]) + answer[at + 1 :]
        if miss not in avoid:
            return miss
