"""OpenEnv apps for tests/test_openenv.py that Hone starts as processes (`env.args.app`): the guess_number
port as the published apps serve by default, one session at a time; and an MCP-style calculator."""

from __future__ import annotations

import asyncio
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server import Action, Observation, State, create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from hone.envs.openenv_games import GuessAction, GuessNumberEnvironment, GuessObservation

one_session = create_app(GuessNumberEnvironment, GuessAction, GuessObservation, env_name="guess_number")


# An MCP-style OpenEnv environment (openenv-core's MCPEnvironment over a FastMCP server) for
# tests/test_openenv_mcp.py: `calc` adds, `submit` ends the episode with reward 1 for reset's a + b.
class CalculatorObservation(Observation):
    message: str = ""  # the task, when reset is asked to state it


class Calculator(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        server = FastMCP("calculator")
        self._target, self._submitted, self._stall = 0, None, 0.0

        @server.tool()
        async def calc(a: int, b: int) -> int:
            """Add two integers."""
            await asyncio.sleep(self._stall)  # a server that hangs (async: the other sessions go on)
            return a + b

        @server.tool()
        def submit(answer: int) -> str:
            """Submit the final answer; ends the episode."""
            self._submitted = answer
            return "correct" if answer == self._target else "wrong"

        @server.tool()
        def crash() -> str:
            """Fail."""
            raise ValueError("the calculator broke")

        super().__init__(server)
        self._state = State(episode_id="calc", step_count=0)

    def reset(
        self,
        seed: Any = None,
        episode_id: Any = None,
        a: int = 0,
        b: int = 0,
        stall: float = 0.0,
        say: bool = False,
    ) -> CalculatorObservation:
        self._target, self._submitted, self._stall = a + b, None, stall
        return CalculatorObservation(message=f"What is {a}+{b}?" if say else "", done=False, reward=0.0)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "submit" and observation.error is None:
            observation.reward = float(self._submitted == self._target)
            observation.done = True
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"not a tool call: {action}"})

    @property
    def state(self) -> State:
        return self._state


calculator = create_app(
    Calculator, CallToolAction, CallToolObservation, env_name="calculator", max_concurrent_envs=8
)
