"""`openenv_mcp`: an MCP-style OpenEnv environment (openenv-core's `MCPEnvironment`, RFC 003) whose tools
are the policy's tools, played one WebSocket session per trajectory like `openenv`.

An MCP-style OpenEnv server is an OpenEnv server (`create_app`) whose environment wraps a FastMCP server:
its step takes `{"type": "list_tools"}` and `{"type": "call_tool", "tool_name", "arguments"}` actions and
answers with `{"tools": [...]}` and `{"tool_name", "result", "error"}` observations, each with the step's
`reward` and `done` (a `submit` tool that scores the answer and ends the episode, say). This adapter is
a `ToolEnv` over such a server, with `openenv`'s server handling (`hone.envs.openenv`: `url`, `app` or
`command`; `servers`, `max_sessions`, `reset_args`, `samples`, `start_timeout_s`, all as there):

* set-up lists the tools once per server (a session: reset with `reset_args`, then `list_tools`); each
  becomes a tool schema the chat template renders (its `input_schema` is the function's `parameters`).
  `tools` keeps a subset (a list of names) or renames them (`{server_name: name_the_policy_sees}`). A
  server that does not answer `list_tools` with tools (a plain OpenEnv server: env `openenv` plays
  those) is one line at set-up.
* reset: a free session (capacity as `openenv` learns it), reset with the sample's `meta` plus
  `reset_args`. The initial messages are the reset observation's `observation_field` text as a `role`
  message when it has one (the server states the task); otherwise the lent game's (`samples`), or the
  sample's own messages or prompt (`MCPEnvironment`s mostly state nothing: their reset's metadata is not
  sent to clients). A lent game is reset either way, so its `finish` knows the sample.
* each tool call the policy writes (Hermes `<tool_call>`, or `parser`) is one `call_tool` step on the
  episode's session, in the order written (a session answers one message at a time); the result's text
  is the `tool` message. The steps' rewards are summed into the turn's reward, and a step's `done` ends
  the episode (calls written after it are not sent, and are counted as errors).
* an unknown tool, arguments that do not fit the listed schema, a tool the server reports failed (its
  `error`, or a result flagged `is_error`; a server-side tool timeout too) are `Error: ...` observations
  counted in `env/tool_errors`, never fatal; `max_calls` bounds an episode's calls, as in `mcp`.
* a turn without a tool call is the final answer: it ends the episode with reward 0 from the environment
  (the recipe's reward scores the answer), or the lent game's `finish` verdict when `samples` is a tool
  game (e.g. `tool_arithmetic`).
* a session error (a lost connection, a server error, no answer within `timeout_s`) ends the episode as
  an environment error, which the rollout loop counts in `env/errors`: a call that timed out on the client
  leaves the session mid-message, so nothing later in it could be trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
from collections.abc import Awaitable
from typing import Any

from hone.envs.base import Message, StepResult, register_env, register_release
from hone.envs.openenv import OpenEnv
from hone.envs.openenv_servers import _check_server
from hone.envs.tool_env import ToolEnv
from hone.envs.tools import Tool, ToolError, select_tools
from hone.types import Sample

# Each server's listed tools (by URL and reset args): every episode builds an adapter, and only the
# first of a run need ask the server. Forgotten when the run ends, with the servers it started.
_LISTED: dict[str, list[dict[str, Any]]] = {}
_LOCK = threading.Lock()


def _forget() -> None:
    with _LOCK:
        _LISTED.clear()


register_release(_forget)


class OpenEnvSessionError(RuntimeError):
    """The episode's session failed: it ends that episode (counted in `env/errors`), not the run."""


async def _listing(url: str, reset_args: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    """The server's tools as its `list_tools` step lists them, in a session of their own."""
    from openenv.core.generic_client import GenericEnvClient

    client = GenericEnvClient(url, connect_timeout_s=timeout_s, message_timeout_s=timeout_s)
    try:
        what = "reset"
        await client.reset(**reset_args)
        what = "list_tools step"
        observation = (await client.step({"type": "list_tools"})).observation
    except Exception as error:
        raise ValueError(f"its {what} failed: {type(error).__name__}: {error}") from error
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    tools = observation.get("tools")
    if not isinstance(tools, list):
        raise ValueError(f"its list_tools step answered an observation with fields {sorted(observation)}")
    if not tools:
        raise ValueError("its list_tools step listed no tools")
    return tools


def _tools_of(url: str, reset_args: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    key = json.dumps([url, reset_args], sort_keys=True, default=str)
    with _LOCK:
        if key in _LISTED:
            return _LISTED[key]
    found: list[Any] = []

    def run() -> None:
        try:
            found.append(asyncio.run(_listing(url, reset_args, timeout_s)))
        except Exception as error:
            found.append(error)

    # A loop of its own: set-up may run inside the rollout's event loop.
    thread = threading.Thread(target=run, name="hone-openenv-tools", daemon=True)
    thread.start()
    thread.join(timeout=timeout_s * 3)
    reason = found[0] if found else f"no answer within {timeout_s * 3:g} s"
    if not isinstance(reason, list):
        raise ValueError(
            f"env 'openenv_mcp' needs an MCP-style OpenEnv server (openenv-core's MCPEnvironment), but the "
            f"server at {url} is not one: {reason} (a plain OpenEnv server is env.name openenv)"
        )
    with _LOCK:
        return _LISTED.setdefault(key, reason)


def _result_text(result: Any) -> tuple[str, bool]:
    """A `call_tool` observation's `result` as text, and whether the tool flagged it an error. FastMCP's
    `CallToolResult` arrives as a dict: its text parts joined (other parts named: no vision inputs yet),
    its structured content as JSON when it has no text; any other value (a mode-specific tool's) as JSON."""
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        parts = [
            str(item.get("text", ""))
            if item.get("type") == "text"
            else f"[{item.get('type', 'content')} omitted]"
            for item in result["content"]
            if isinstance(item, dict)
        ]
        if not parts and result.get("structured_content") is not None:
            parts.append(json.dumps(result["structured_content"]))
        return "\n".join(parts), bool(result.get("is_error") or result.get("isError"))
    if result is None:
        return "", False
    return (result if isinstance(result, str) else json.dumps(result, default=str)), False


@register_env("openenv_mcp")
class OpenEnvMCP(ToolEnv, OpenEnv):
    """An MCP-style OpenEnv server's tools, one session per instance (one instance per trajectory); see
    the module docstring for the arguments. `ToolEnv` parses and answers the calls; `OpenEnv` finds,
    starts and shares the servers and holds the episode's session."""

    _NAME = "openenv_mcp"

    def __init__(
        self,
        url: str | None = None,
        app: str | None = None,
        command: list[str] | None = None,
        tools: list[str] | dict[str, str] | None = None,
        observation_field: str = "message",
        role: str = "user",
        reset_args: dict[str, Any] | None = None,
        samples: str | None = None,
        samples_args: dict[str, Any] | None = None,
        max_calls: int = 16,
        max_calls_per_turn: int = 4,
        parser: str = "hermes",
        start_timeout_s: float = 60.0,
        timeout_s: float = 60.0,
        max_sessions: int | None = None,
        servers: int = 1,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"env.args.timeout_s must be > 0, got {timeout_s}")
        self._listed: list[dict[str, Any]] = []
        OpenEnv.__init__(  # lists the tools in `_check`, before the sessions are counted
            self,
            url=url,
            app=app,
            command=command,
            observation_field=observation_field,
            role=role,
            reset_args=reset_args,
            samples=samples,
            samples_args=samples_args,
            start_timeout_s=start_timeout_s,
            timeout_s=timeout_s,
            max_sessions=max_sessions,
            servers=servers,
        )
        ToolEnv.__init__(
            self,
            self._kept_tools(tools, max_calls_per_turn),
            parser=parser,
            max_calls_per_turn=max_calls_per_turn,
            max_calls_per_episode=max_calls,
        )
        self._lock = asyncio.Lock()  # one message at a time on the session (bound to a loop at first use)
        # Why the session can no longer be trusted (a call sent, its answer not read), or None.
        self._lost: str | None = None
        self._reward, self._done = 0.0, False

    def _check(self, timeout_s: float) -> None:
        _check_server(self.url, {}, timeout_s)  # /health and /schema answer: one line if not
        self._listed = _tools_of(self.url, self.reset_args, timeout_s)

    def _kept_tools(self, keep: list[str] | dict[str, str] | None, per_turn: int) -> list[Tool]:
        listed = {str(spec.get("name")): spec for spec in self._listed}
        names = select_tools(list(listed), keep, f"the OpenEnv server at {self.url}")
        # The calls of a turn wait for each other on the session: the client's `timeout_s` bounds each
        # one, and this outer bound only catches a call the client failed to bound.
        backstop = self.timeout_s * (per_turn + 1)
        return [self._tool(listed[name], shown, backstop) for name, shown in names.items()]

    def _tool(self, spec: dict[str, Any], shown: str, timeout_s: float) -> Tool:
        server_name, description = str(spec["name"]), str(spec.get("description") or "")
        parameters = (
            spec.get("input_schema") or spec.get("inputSchema") or {"type": "object", "properties": {}}
        )
        schema = {
            "type": "function",
            "function": {"name": shown, "description": description, "parameters": dict(parameters)},
        }

        async def call(**arguments: Any) -> str:
            return await self._call(server_name, shown, arguments)

        return Tool(shown, description, schema, call, timeout_s)

    async def reset(self, sample: Sample) -> list[Message]:
        self.calls_left = self.max_calls_per_episode
        self._reward, self._done, self._lost = 0.0, False, None
        stated = await OpenEnv.reset(self, sample)  # a free session, reset with reset_args + meta
        if self._source is not None:
            lent = self._source.reset(sample)
            lent = await lent if inspect.isawaitable(lent) else lent
            return stated or lent
        if stated:
            return stated
        if sample.messages:
            return [dict(m) for m in sample.messages]
        if sample.prompt:
            return [{"role": "user", "content": sample.prompt}]
        raise ValueError(
            f"openenv_mcp: sample {sample.id!r} has no prompt or messages, and the server's reset "
            f"observation no {self.observation_field!r} text (env.args.observation_field)"
        )

    def _messages(self, observation: dict[str, Any]) -> list[Message]:
        value = observation.get(self.observation_field)
        if value is None or value == "":
            return []
        return [{"role": self.role, "content": value if isinstance(value, str) else json.dumps(value)}]

    async def step(self, assistant_message: str) -> StepResult:
        if self._client is None:
            raise RuntimeError("openenv_mcp: step before reset")
        self._reward, self._done = 0.0, False
        result = await super().step(assistant_message)  # ToolEnv's: parse, run the calls, or finish
        if self._lost is not None:  # `ToolEnv` made the failed call an observation: the episode ends here
            raise OpenEnvSessionError(self._lost)
        result.reward += self._reward
        result.done = result.done or self._done
        return result

    def finish(self, final_message: str) -> StepResult | Awaitable[StepResult]:
        """The lent tool game's verdict, or none: the recipe's reward scores the final answer."""
        if isinstance(self._source, ToolEnv):
            return self._source.finish(final_message)
        return StepResult([], reward=0.0, done=True)

    async def _call(self, name: str, shown: str, arguments: dict[str, Any]) -> str:
        """One `call_tool` step; its reward and `done` are kept for the turn's result."""
        async with self._lock:
            if self._lost is not None:
                raise OpenEnvSessionError(self._lost)
            if self._done:
                raise ToolError(f"{shown}: not run: the episode ended at an earlier call")
            # Until the answer is read: a call cut off by the outer bound leaves it on the way.
            self._lost = f"openenv_mcp: call_tool {name} on {self.url} got no answer"
            action = {"type": "call_tool", "tool_name": name, "arguments": arguments}
            try:
                result = await self._client.step(action)
            except Exception as error:  # a lost connection, a server error, the client's timeout
                self._lost = (
                    f"openenv_mcp: call_tool {name} on {self.url} failed: {type(error).__name__}: {error}"
                )
                raise OpenEnvSessionError(self._lost) from error
            self._lost = None
            self._reward += float(result.reward or 0.0)
            self._done = self._done or bool(result.done)
        observation = result.observation
        failure = observation.get("error")  # the server's: the tool failed, timed out, or was refused
        if failure:
            message = failure.get("message") if isinstance(failure, dict) else failure
            raise ToolError(f"{shown}: {message}")
        text, failed = _result_text(observation.get("result"))
        if failed:
            raise ToolError(text or f"{shown} failed")
        return text
