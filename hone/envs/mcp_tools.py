"""`mcp`: the tools of a Model Context Protocol server become the policy's tools (the `mcp` extra).

MCP (modelcontextprotocol.io) is how tool servers are packaged today: a program that speaks JSON-RPC over
stdio (`command`) or streamable HTTP (`url`) and lists its tools with JSON schemas. This environment is a
`ToolEnv` whose tools are that server's, through the official `mcp` SDK's client:

* the server's `tools/list` becomes the tool schemas the chat template renders into the prompt (its
  `inputSchema` is the function's `parameters`); `tools` keeps a subset (a list of names) or renames them
  (`{server_name: name_the_policy_sees}`: e.g. the name a warm start's demonstrations use);
* each call the policy writes (Hermes `<tool_call>`, or `parser`) is a `tools/call`; its text content is
  the observation; a result the server flags `isError`, a timeout (`timeout_s` per call), an unknown tool,
  bad arguments and a lost server are all observations, counted in `env/tool_errors`/`env/tool_timeouts`,
  never fatal; `max_calls` bounds the calls of one episode (more are answered with an error);
* the task comes from the data (`sample.messages` or `prompt`) and the recipe's reward scores the final
  answer; or `samples: <a game or pkg.mod:Class>` lends its problems, its SFT demonstrations and its
  scoring (its `finish`), e.g. `tool_arithmetic` for recipe `agent-mcp-calculator`.

One server per run, not per episode: its client session (a single stdio pipe multiplexes concurrent
calls by JSON-RPC id) lives on a thread of its own with its own event loop, so every episode, whatever
loop it runs on, calls through it. It is started when the recipe is set up (a bad command or an
unreachable URL is one line then), restarted if it dies (at most `_RESTARTS` times a run; each restart
logged with its last stderr lines), and stopped when the run ends (`release_envs`: success, error,
Ctrl-C, SIGTERM), at interpreter exit, and by the kernel when the trainer dies: a stdio server is
spawned through a two-line shim that sets the parent-death signal and then `exec`s the command.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any

from hone.envs.base import LendsSamples, Message, StepResult, register_env, register_release
from hone.envs.tool_env import ToolEnv
from hone.envs.tools import Tool, ToolError, select_tools
from hone.types import Sample

log = logging.getLogger("hone")
# The SDK logs a server's bad output and lost connections with tracebacks (ERROR); each is reported here
# in one line instead (a set-up error, or a counted tool error with the server's stderr).
logging.getLogger("mcp").setLevel(logging.CRITICAL)
_RESTARTS = 3  # a server that dies more often than this in one run stays down (its calls are errors)
_TAIL_CHARS = 600
# The SDK's own read timeout is a backstop past the tool's `timeout_s`, which `ToolEnv` enforces: two
# timers of the same length raced, and when the SDK's fired first (a loaded machine) a slow call read as a
# lost server and restarted it.
_SDK_TIMEOUT_GRACE_S = 5.0
_SDK_TIMEOUT_CODES = (-32001, 408)
# Runs between fork and exec of a stdio server: the kernel sends it SIGTERM when the thread that started
# it (the connection's thread, alive for the whole run) exits, the trainer's death included; a parent that
# died before the prctl is caught by the ppid check. Then the real command replaces the shim.
_SHIM = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL('libc.so.6',use_errno=True).prctl(1,signal.SIGTERM)\n"
    "os.getppid()==int(sys.argv[1]) or sys.exit(1)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])"
)


class _StartError(Exception):
    """A server that did not answer `initialize` and `tools/list`."""


class _Connection:
    """One MCP client session, run on its own thread's event loop; `call` may be awaited from any loop."""

    def __init__(
        self, command: list[str] | None, url: str | None, env: dict[str, str], start_timeout_s: float
    ) -> None:
        self.command, self.url, self.env = command, url, env
        self.start_timeout_s = start_timeout_s
        self.where = f"`{' '.join(command)}`" if command else str(url)
        self.restarts = 0
        # The server's stderr, for error messages; lives as long as the connection (closed in `close`).
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hone-mcp", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._served: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()
        try:
            self.tools: list[Any] = self._run(self._connect(), start_timeout_s + 5.0)
        except Exception as error:
            self._stop_session()
            self._thread.join(timeout=1.0)  # the stopped server's last stderr lines land
            message = (
                f"the MCP server {self.where} did not start: {_reason(error)}; its last stderr: {self.tail()}"
            )
            self.close()
            raise _StartError(message) from None

    def _run(self, coro: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout_s)

    async def _connect(self) -> list[Any]:
        """Start the session task and wait until it has listed the server's tools."""
        ready: asyncio.Future[list[Any]] = self._loop.create_future()
        self._stop = asyncio.Event()
        task = self._loop.create_task(self._serve(ready, self._stop))
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self.start_timeout_s)
        except BaseException:
            self._stop.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 10.0)
            raise

    async def _serve(self, ready: asyncio.Future[list[Any]], stop: asyncio.Event) -> None:
        """Hold the transport and session open until `stop`; leaving the `async with`s stops a stdio
        server (stdin closed, then SIGTERM, then SIGKILL: the SDK's shutdown)."""
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listed = await session.list_tools()
                self._session = session
                ready.set_result(list(listed.tools))
                await stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else RuntimeError(str(error)))
            if not isinstance(error, Exception):
                raise
        finally:
            self._session = None

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        assert self.command
        argv = [*(["-c", _SHIM, str(os.getpid())] if sys.platform == "linux" else []), *self.command]
        command = sys.executable if sys.platform == "linux" else argv.pop(0)
        params = StdioServerParameters(command=command, args=argv, env=self.env or None)
        return stdio_client(params, errlog=self._stderr)

    def tail(self) -> str:
        """The server's last stderr output, for error messages."""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.flush()
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - _TAIL_CHARS * 4))
            text = " | ".join(line.strip() for line in self._stderr.read().splitlines() if line.strip())
            return text[-_TAIL_CHARS:] or "(no output)"
        return "(no output)"

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """`tools/call` on the connection's loop; a lost session is restarted once per call."""
        session = self._session or await asyncio.to_thread(self._restart)
        future = asyncio.run_coroutine_threadsafe(
            session.call_tool(name, arguments, read_timeout_seconds=timeout_s + _SDK_TIMEOUT_GRACE_S),
            self._loop,
        )
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # our timeout: stop the call on the connection's loop too
            future.cancel()
            raise

    def _restart(self) -> Any:
        with self._lock:
            if self._session is not None:  # another episode restarted it first
                return self._session
            if self.restarts >= _RESTARTS:
                raise ToolError(f"the MCP server {self.where} is down (restarted {_RESTARTS} times already)")
            self.restarts += 1
            log.warning("MCP server %s lost; restarting it. Its last stderr: %s", self.where, self.tail())
            self._stop_session()
            try:
                self._run(self._connect(), self.start_timeout_s)
            except Exception as error:
                raise ToolError(f"the MCP server {self.where} could not be restarted: {error}") from error
            return self._session

    def lost(self) -> None:
        """The transport failed: the next call restarts the session."""
        self._stop_session()
        self._session = None

    def _stop_session(self) -> None:
        if self._stop is not None:
            stop = self._stop
            self._loop.call_soon_threadsafe(stop.set)

    def close(self) -> None:
        """Stop the server (its shutdown bounded by the SDK's own timeouts) and the thread."""
        self._stop_session()
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                self._run(_drain(self._loop), 30.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)
        self._stderr.close()


async def _drain(loop: asyncio.AbstractEventLoop) -> None:
    """Wait for the loop's other tasks (the sessions' shutdowns) to end."""
    current = asyncio.current_task()
    await asyncio.gather(*(t for t in asyncio.all_tasks(loop) if t is not current), return_exceptions=True)


_CONNECTIONS: dict[str, _Connection] = {}
_LOCK = threading.Lock()


# Where a Hone clone keeps the servers its packaged recipes name (`make setup-mcp`: `.venv-mcp/bin/`).
_CLONE = Path(__file__).resolve().parents[2]


def _executable(program: str) -> str:
    """`program` as a path to run: on PATH, or a path from the current folder, or else (for a packaged
    recipe's `.venv-mcp/...`, run from any folder) from the Hone clone's root. A one-line `ValueError`
    naming the fix when it is none of them."""
    if shutil.which(program) is not None:
        return program
    in_clone = _CLONE / program
    if not Path(program).is_absolute() and shutil.which(str(in_clone)) is not None:
        return str(in_clone)
    hint = " (the packaged recipes' server: make setup-mcp in a Hone clone)" if ".venv-mcp" in program else ""
    raise ValueError(f"env.args.command: {program!r} is not an executable (a path, or a name on PATH){hint}")


def _connection(
    command: list[str] | None, url: str | None, env: dict[str, str], timeout_s: float
) -> _Connection:
    key = json.dumps([command, url, sorted(env.items())])
    with _LOCK:
        connection = _CONNECTIONS.get(key)
        if connection is None:
            connection = _CONNECTIONS[key] = _Connection(command, url, env, timeout_s)
        return connection


def stop_servers() -> None:
    """Stop every MCP server this process started (idempotent; a later run starts its own)."""
    with _LOCK:
        connections = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for connection in connections:
        connection.close()


register_release(stop_servers)
atexit.register(stop_servers)


def _text(result: Any) -> str:
    """A `CallToolResult`'s content as one observation text; non-text parts are named, not shown."""
    parts = []
    for item in result.content:
        if getattr(item, "type", None) == "text":
            parts.append(item.text)
        else:  # images, audio, resources: no vision inputs yet
            parts.append(f"[{getattr(item, 'type', 'content')} omitted]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


@register_env("mcp")
class MCPEnv(LendsSamples, ToolEnv):
    """A Model Context Protocol server's tools; see the module docstring for the arguments."""

    _NAME = "mcp"
    _SAMPLES_HINT = "a game, e.g. tool_arithmetic"

    def __init__(
        self,
        command: list[str] | str | None = None,
        url: str | None = None,
        env: dict[str, str] | None = None,
        tools: list[str] | dict[str, str] | None = None,
        timeout_s: float = 30.0,
        max_calls: int = 16,
        max_calls_per_turn: int = 4,
        start_timeout_s: float = 60.0,
        parser: str = "hermes",
        samples: str | None = None,
        samples_args: dict[str, Any] | None = None,
    ) -> None:
        if importlib.util.find_spec("mcp") is None:
            raise ValueError("env 'mcp' needs the MCP SDK: pip install -e '.[mcp]' in a Hone clone")
        if (command is None) == (url is None):
            raise ValueError(
                "env.args needs exactly one of command (a stdio MCP server: a list or a string) or url (a "
                "streamable-HTTP MCP server)"
            )
        argv = command.split() if isinstance(command, str) else [str(a) for a in command or []]
        if command is not None and not argv:
            raise ValueError("env.args.command is empty")
        if argv:
            argv[0] = _executable(argv[0])
        if timeout_s <= 0:
            raise ValueError(f"env.args.timeout_s must be > 0, got {timeout_s}")
        self._lend(samples, samples_args)
        try:
            connection = _connection(argv or None, url, dict(env or {}), start_timeout_s)
        except _StartError as error:  # a command that does not speak MCP, a URL that does not answer
            raise ValueError(str(error)) from None
        self.connection = connection
        super().__init__(
            _tools(connection, tools, timeout_s),
            parser=parser,
            max_calls_per_turn=max_calls_per_turn,
            max_calls_per_episode=max_calls,
        )

    def reset(self, sample: Sample) -> list[Message] | Awaitable[list[Message]]:
        if self._source is not None:
            return self._source.reset(sample)
        if sample.messages:
            return [dict(m) for m in sample.messages]
        return [{"role": "user", "content": sample.prompt or ""}]

    def finish(self, final_message: str) -> StepResult | Awaitable[StepResult]:
        """The lent game's verdict, or none: the recipe's reward scores the final answer."""
        if self._source is not None and isinstance(self._source, ToolEnv):
            return self._source.finish(final_message)
        return StepResult([], reward=0.0, done=True)


def _tools(connection: _Connection, keep: list[str] | dict[str, str] | None, timeout_s: float) -> list[Tool]:
    """The server's tools as `Tool`s, kept and renamed as `env.args.tools` says."""
    listed = {tool.name: tool for tool in connection.tools}
    names = select_tools(list(listed), keep, f"the MCP server {connection.where}")
    return [_tool(connection, listed[name], shown, timeout_s) for name, shown in names.items()]


def _is_request_timeout(error: Exception) -> bool:
    """The MCP SDK's own request timeout, not a failed transport: its error code is -32001 in mcp 2 (408,
    HTTP's, in mcp 1)."""
    data = getattr(error, "error", None)
    return getattr(data, "code", None) in _SDK_TIMEOUT_CODES


def _tool(connection: _Connection, spec: Any, shown: str, timeout_s: float) -> Tool:
    server_name = spec.name
    description = spec.description or ""
    parameters = dict(spec.input_schema or {"type": "object", "properties": {}})
    schema = {
        "type": "function",
        "function": {"name": shown, "description": description, "parameters": parameters},
    }

    async def call(**arguments: Any) -> str:
        try:
            result = await connection.call(server_name, arguments, timeout_s)
        except (ToolError, TimeoutError, asyncio.CancelledError):
            raise
        except Exception as error:  # the transport failed: the server died or hung up
            if _is_request_timeout(error):  # the SDK's backstop: slow, not lost
                raise TimeoutError(f"{shown} timed out") from error
            connection.lost()
            raise ToolError(f"{shown}: the MCP server failed: {_reason(error)}") from error
        text = _text(result)
        if result.is_error:
            raise ToolError(text or f"{shown} failed")
        return text

    return Tool(shown, description, schema, call, timeout_s)


def _reason(error: BaseException) -> str:
    """One line for an error that may be an exception group (anyio's task groups raise those)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}".strip().splitlines()[0]
