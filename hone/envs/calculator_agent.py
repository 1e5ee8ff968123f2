"""The calculator tool task (`tool_arithmetic`) as an agent program: plain `openai` client code.

Nothing here knows about training: the agent gets an OpenAI client (Hone points it at the episode's base
URL, `rollout.agent`), asks the model, runs the calculator when the model calls it, and returns 1.0 when
the final answer is the right number. The question and the tool schema are `tool_arithmetic`'s own, so a
recipe can warm-start the model on that environment's scripted demonstrations (the same tokens).
"""

from __future__ import annotations

import json
from typing import Any

from hone.envs.tools import ToolError, calculator, calculator_tool
from hone.types import Sample
from hone.verifiers.math import math_reward

TOOLS = [calculator_tool().schema]
MAX_TURNS = 4  # tool_arithmetic's own


async def run(client: Any, sample: Sample) -> float:
    """One episode: `client` is an `openai.AsyncOpenAI`; returns the reward."""
    question = f"What is {sample.meta['a']}{sample.meta['op']}{sample.meta['b']}? "
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": question + "Use the calculator tool, then reply with the answer."}
    ]
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:  # the final answer
            return math_reward(reply.content or "", sample.answer or "", require_evaluated=True)
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": _calculate(call)})
    return 0.0


def _calculate(call: Any) -> str:
    if call.function.name != "calculator":
        return f"Error: unknown tool {call.function.name!r}; available: calculator"
    try:
        return calculator(**json.loads(call.function.arguments))
    except (ToolError, TypeError, ValueError) as e:
        return f"Error: {e}"
