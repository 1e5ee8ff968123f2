"""The built-in game `tool_arithmetic`: multiply or add 3–4-digit numbers with a calculator tool, then answer.

See `hone.envs.games` for all the games."""

from __future__ import annotations

import json
import random
from typing import Any

from hone.envs.base import Message, StepResult, register_env
from hone.envs.games.common import draw, user_turn
from hone.envs.tool_env import ToolEnv
from hone.envs.tools import calculator, calculator_tool
from hone.types import Sample
from hone.verifiers.math import math_reward


@register_env("tool_arithmetic")
class ToolArithmetic(ToolEnv):
    """ "What is 4521*37? ..." with a calculator tool; reward 1.0 for a final answer equal to the value
    (written out: `4521*37` left for the verifier to evaluate scores 0, or the tool would be optional).
    """

    max_turns = 4

    def __init__(self, max_calls_per_turn: int = 4) -> None:
        super().__init__([calculator_tool()], max_calls_per_turn=max_calls_per_turn)
        self.answer: str | None = None

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, **args: Any) -> list[Sample]:
        def make(rng: random.Random) -> tuple[str, Sample]:
            a, b, op = rng.randint(100, 9999), rng.randint(100, 9999), rng.choice("+*")
            value = a + b if op == "+" else a * b
            meta = {"a": a, "b": b, "op": op}
            sample = Sample(id="", messages=[user_turn(_question(a, op, b))], answer=str(value), meta=meta)
            return f"{min(a, b)}{op}{max(a, b)}", sample  # a*b and b*a are one problem

        return draw("tool_arithmetic", n, seed, split, make)

    def reset(self, sample: Sample) -> list[Message]:
        if sample.answer is None:
            raise ValueError(f"tool_arithmetic sample {sample.id!r} has no answer")
        self.answer = sample.answer
        if {"a", "b", "op"} <= sample.meta.keys():
            return [user_turn(_question(sample.meta["a"], sample.meta["op"], sample.meta["b"]))]
        if sample.messages:  # a dataset's own question
            return [dict(m) for m in sample.messages]
        return [user_turn(sample.prompt or "")]

    def finish(self, final_message: str) -> StepResult:
        reward = math_reward(final_message, self.answer or "", require_evaluated=True)
        return StepResult([], reward=reward, done=True, info={"solved": reward})

    def demonstration(self, sample: Sample) -> list[Message]:
        expression = f"{sample.meta['a']}{sample.meta['op']}{sample.meta['b']}"
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        return [
            *self.reset(sample),
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "name": "calculator", "content": calculator(expression)},
            {"role": "assistant", "content": sample.answer or ""},
        ]


def _question(a: int, op: str, b: int) -> str:
    return f"What is {a}{op}{b}? Use the calculator tool, then reply with the answer."
