"""Environments for multi-turn rollouts: games, tool use, and the interface to write your own.

`Environment.reset(sample) -> messages` starts an episode; `step(assistant_message) -> StepResult`
answers each assistant turn. `ToolEnv` adds tools (Python functions turned into JSON schemas, called
in the Hermes `<tool_call>` format, run concurrently with timeouts). Built-in environments, by name:
`tool_arithmetic`, `guess_number`, `frozen_lake`, `zoom_digit` (image observations; see
`hone.envs.games`), `openenv`, an OpenEnv server's environment (`hone.envs.openenv`), `openenv_mcp`, an
MCP-style OpenEnv server's tools (`hone.envs.openenv_tools`), and `mcp`, a Model Context Protocol
server's tools (`hone.envs.mcp_tools`). A recipe names one of them, any class by dotted path
(`mypkg.envs:UnitsEnv`), or a verifiers environment (`verifiers:<id>`, see `hone.envs.verifiers_env`);
`make_env` builds the per-rollout factory. A class written for TRL's `GRPOTrainer(environment_factory=...)`
(`reset(**row)`, its public methods as tools, an optional `get_reward`) is named the same way and runs
unchanged, wrapped by `hone.envs.trl_env`; `trl` routes each row among several by its `environment` column.

A tool environment of your own (this block is run by the test suite):

```python
import asyncio

from hone.envs import StepResult, Tool, ToolEnv
from hone.rewards import math_reward
from hone.types import Sample


def to_metres(value: float, unit: str) -> float:
    \"\"\"Convert a length to metres.

    Args:
        value: The length.
        unit: Its unit: km, m, cm or mm.
    \"\"\"
    return value * {"km": 1000, "m": 1, "cm": 0.01, "mm": 0.001}[unit]


class UnitsEnv(ToolEnv):
    max_turns = 3

    def __init__(self) -> None:
        super().__init__(tools=[Tool.from_function(to_metres, timeout_s=2)])

    def reset(self, sample: Sample) -> list[dict]:
        self.answer = sample.answer  # per-episode state: one instance per rollout
        return [{"role": "user", "content": sample.prompt}]

    def finish(self, final_message: str) -> StepResult:
        return StepResult([], reward=math_reward(final_message, self.answer), done=True)


env = UnitsEnv()
env.reset(Sample(id="0", prompt="How many metres are 3.5 km?", answer="3500"))
call = '<tool_call>{"name": "to_metres", "arguments": {"value": 3.5, "unit": "km"}}</tool_call>'
observation = asyncio.run(env.step(call))  # one tool message: "3500.0"
final = asyncio.run(env.step("3500 metres."))  # no tool call: finish() scores it
assert observation.messages[0]["content"] == "3500.0" and final.done and final.reward == 1.0
```
"""

from hone.envs.base import (
    ENVIRONMENTS,
    Environment,
    Message,
    PlayingEnvironment,
    StepResult,
    env_reads_answer,
    make_env,
    register_env,
    release_envs,
    resolve_env,
)
from hone.envs.games import FrozenLake, GuessNumber, ToolArithmetic, ZoomDigit  # registers the games
from hone.envs.mcp_tools import MCPEnv  # registers `mcp` (the MCP SDK is imported when a server starts)
from hone.envs.openenv import OpenEnv  # registers `openenv` (openenv-core is imported when one plays)
from hone.envs.openenv_tools import OpenEnvMCP  # registers `openenv_mcp`, an MCP-style OpenEnv server's tools
from hone.envs.parsers import PARSERS, HermesParser, ToolCall, ToolCallError, ToolCallParser, get_parser
from hone.envs.tool_env import ToolEnv
from hone.envs.tools import (
    Tool,
    ToolError,
    calculator,
    calculator_tool,
    python_tool,
    run_tool,
    search_tool,
    sql_tool,
)
from hone.envs.trl_env import TrlEnv  # registers `trl`; wraps TRL environment classes (`make_env`)

__all__ = [
    "ENVIRONMENTS",
    "PARSERS",
    "Environment",
    "FrozenLake",
    "GuessNumber",
    "HermesParser",
    "MCPEnv",
    "Message",
    "OpenEnv",
    "OpenEnvMCP",
    "PlayingEnvironment",
    "StepResult",
    "Tool",
    "ToolArithmetic",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "ToolEnv",
    "ToolError",
    "TrlEnv",
    "ZoomDigit",
    "calculator",
    "calculator_tool",
    "env_reads_answer",
    "get_parser",
    "make_env",
    "python_tool",
    "register_env",
    "release_envs",
    "resolve_env",
    "run_tool",
    "search_tool",
    "sql_tool",
]
