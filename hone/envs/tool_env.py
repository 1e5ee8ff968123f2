"""`ToolEnv`: an environment whose model acts by calling tools, and ends the episode by answering.

Each assistant turn is parsed for tool calls (Hermes `<tool_call>` format by default). Calls run
concurrently, each under its tool's timeout, and every call gets exactly one `tool` message back, in
the order the calls were written. A turn without a call is the final answer: `finish` scores it.

Nothing the model writes raises. Bad JSON, an unknown tool, wrong arguments, a tool that fails or times
out: each becomes an `Error: ...` observation (the model can read it and retry next turn) and is
counted in `info` (`tool_calls`, `tool_errors`, `tool_timeouts`; timeouts are not also counted as
errors), which the rollout loop sums into `env/*` metrics.

Sync tools run on a dedicated thread pool rather than asyncio's default executor: that one has only
`cpu_count + 4` workers and is shared with the rest of the process, so a batch of rollouts calling
tools at once would queue there and time out without having run. A sync tool that times out cannot be
killed and keeps its worker until it returns; tools that can hang should bound themselves (the python
tool's sandbox and the sql tool's progress handler do) or be `async` (those are cancelled).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from abc import abstractmethod
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from hone.envs.base import Environment, Message, StepResult
from hone.envs.parsers import ToolCall, ToolCallError, ToolCallParser, get_parser
from hone.envs.tools import Tool, ToolError, format_result, run_tool

_TOOL_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="hone-tool")


class ToolEnv(Environment):
    """Subclasses implement `reset` (the task's messages) and `finish` (score the final answer)."""

    max_output_chars: ClassVar[int] = 4000  # a tool's text is cut here: observations cost context

    def __init__(
        self,
        tools: list[Tool],
        parser: str | ToolCallParser = "hermes",
        max_calls_per_turn: int = 4,
        max_calls_per_episode: int | None = None,
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        if max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        self._tools = {t.name: t for t in tools}
        self.parser = get_parser(parser)
        if max_calls_per_episode is not None and max_calls_per_episode < 1:
            raise ValueError(f"max_calls_per_episode must be >= 1, got {max_calls_per_episode}")
        self.max_calls_per_turn = max_calls_per_turn
        self.max_calls_per_episode = max_calls_per_episode
        self.calls_left = max_calls_per_episode  # one instance plays one episode

    # A read-only property where `Environment` declares a plain attribute: mypy calls that an override.
    @property
    def tools(self) -> list[dict] | None:  # type: ignore[override]
        return [t.schema for t in self._tools.values()] or None

    @abstractmethod
    def finish(self, final_message: str) -> StepResult | Awaitable[StepResult]:
        """Score the final answer (a turn with no tool call); return a `done` StepResult."""

    async def step(self, assistant_message: str) -> StepResult:
        calls = self.parser.parse(assistant_message)
        if not calls:
            result = self.finish(assistant_message)
            return await result if inspect.isawaitable(result) else result
        allowed = (
            self.max_calls_per_turn
            if self.calls_left is None
            else min(self.max_calls_per_turn, self.calls_left)
        )
        kept, dropped = calls[:allowed], calls[allowed:]
        if self.calls_left is not None:
            self.calls_left -= len(kept)
        outcomes = await self._run_all(kept)
        messages = [_tool_message(name, text) for name, text, _ in outcomes]
        kinds = [kind for _, _, kind in outcomes]
        if dropped:
            if allowed < self.max_calls_per_turn:
                note = f"Error: the episode's {self.max_calls_per_episode} tool calls are spent"
            else:
                note = f"Error: at most {self.max_calls_per_turn} tool calls per turn"
            messages.append(_tool_message("error", f"{note}; {len(dropped)} not run"))
        info = {
            "tool_calls": float(len(calls)),
            "tool_errors": float(kinds.count("error") + len(dropped)),
            "tool_timeouts": float(kinds.count("timeout")),
        }
        return StepResult(messages, reward=0.0, done=False, info=info)

    async def _run_all(self, calls: list[ToolCall | ToolCallError]) -> list[tuple[str, Any, str]]:
        """Every call of a turn, concurrently; the outcomes in the order the calls were written."""
        return list(await asyncio.gather(*(self._run(call) for call in calls)))

    async def _run(self, call: ToolCall | ToolCallError) -> tuple[str, Any, str]:
        """(tool name, observation text, "ok" | "error" | "timeout") for one parsed call."""
        if isinstance(call, ToolCallError):
            return "error", f"Error: {call.message}", "error"
        tool = self._tools.get(call.name)
        if tool is None:
            return (
                call.name,
                f"Error: unknown tool {call.name!r}; available: {', '.join(self._tools)}",
                "error",
            )
        try:
            text = await asyncio.wait_for(_call(tool, call.arguments), timeout=tool.timeout_s)
        except TimeoutError:
            return tool.name, f"Error: {tool.name} timed out after {tool.timeout_s:g} s", "timeout"
        except ToolError as exc:
            return tool.name, f"Error: {exc}", "error"
        return tool.name, _truncate(text, self.max_output_chars), "ok"


async def _call(tool: Tool, arguments: dict[str, Any]) -> str:
    if not inspect.iscoroutinefunction(tool.fn):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_TOOL_POOL, functools.partial(run_tool, tool, arguments))
    tool.validate(arguments)
    try:
        return format_result(await tool.fn(**arguments))
    except ToolError:
        raise
    except Exception as exc:  # same contract as run_tool: the model's arguments broke the function
        raise ToolError(f"{tool.name}: {type(exc).__name__}: {exc}") from exc


def _tool_message(name: str, content: Any) -> Message:
    return {"role": "tool", "name": name, "content": content}


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n(output cut at {limit} characters)"
