"""The architecture page's worked example (docs/architecture.md, "A new environment whose own code calls
the model"): an environment written as its own program. This file is all a newcomer writes; a recipe
names it as `env.name: tests.self_check_env_for_tests:SelfCheck`.

The policy answers, the environment asks it to check the answer, and the second reply is graded.
"""

from __future__ import annotations

from hone.envs import PlayingEnvironment, StepResult
from hone.envs.base import Chat
from hone.types import Sample


class SelfCheck(PlayingEnvironment):
    max_turns = 2

    async def play(self, sample: Sample, chat: Chat) -> StepResult:
        first = await chat([{"role": "user", "content": sample.prompt or ""}], {})
        final = await chat(
            [{"role": "user", "content": "Check it. Your final answer?"}], {"first_len": len(first)}
        )
        return StepResult(
            [], reward=float(final.strip() == sample.answer), info={"changed": float(first != final)}
        )
