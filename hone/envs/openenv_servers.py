"""The OpenEnv servers a run talks to (`env.name: openenv` and `openenv_mcp`): the processes Hone starts
(one per launch spec and pool index, stopped at the run's end, at exit, and by the kernel with the
trainer), their set-up checks, and how many sessions each serves at once (`max_sessions` or a probe)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from typing import Any

from hone.envs.base import register_release

log = logging.getLogger("hone")
_PR_SET_PDEATHSIG = 1
_LOG_TAIL_LINES = 5
_PROBE_SESSIONS = 64  # sessions a capacity probe opens at most: more than a step's episodes rarely need


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()  # its own process group: stopping it stops whatever the command started
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Server:
    """A server process Hone started: its URL, and the last lines it printed (for the error messages).

    Its output is read by a thread that keeps only the last lines: openenv-core 0.3.0's server logs a
    traceback each time a client closes its session first (its `websocket.close()` meets starlette's
    `WebSocketDisconnect`), a few KB per episode, which a file would pile up over a run."""

    def __init__(self, argv: list[str], port: int, start_timeout_s: float) -> None:
        self.argv = argv
        self.url = f"http://127.0.0.1:{port}"
        self._lines: deque[str] = deque(maxlen=_LOG_TAIL_LINES)
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            preexec_fn=_die_with_parent,
        )
        self._reader = threading.Thread(target=self._read, name="hone-openenv-log", daemon=True)
        self._reader.start()
        try:
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:  # until the process closes its end (exits)
            if line.strip():
                self._lines.append(line.strip())

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise ValueError(
                    f"the OpenEnv server `{' '.join(self.argv)}` exited with code {code} before it answered "
                    f"{self.url}/health; its last lines: {self.tail()}"
                )
            with contextlib.suppress(OSError):  # refused, reset, or an HTTP error status
                _get(f"{self.url}/health", 1.0)
                return
            if time.monotonic() > deadline:
                raise ValueError(
                    f"the OpenEnv server `{' '.join(self.argv)}` did not answer {self.url}/health within "
                    f"{timeout_s:g} s (env.args.start_timeout_s); its last lines: {self.tail()}"
                )
            time.sleep(0.1)

    def tail(self) -> str:
        self._reader.join(timeout=1.0)  # an exited server's last lines may still be in the pipe
        return " | ".join(self._lines) or "(no output)"

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(
                f"the OpenEnv server `{' '.join(self.argv)}` has exited (code {code}); its last lines: "
                f"{self.tail()}"
            )

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 10 s."""
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=wait_s)
                break
        self._reader.join(timeout=5.0)


# Started servers by launch spec: one per run however many episodes (and env instances) use it.
_SERVERS: dict[str, _Server] = {}
_LOCK = threading.Lock()


def _started_server(argv: list[str], start_timeout_s: float, index: int = 0) -> _Server:
    """The run's `index`-th server of `argv` (`env.args.servers`), started on first use."""
    key = json.dumps([argv, index])
    with _LOCK:
        server = _SERVERS.get(key)
        if server is None:
            port = _free_port()
            server = _Server([a.replace("{port}", str(port)) for a in argv], port, start_timeout_s)
            _SERVERS[key] = server
        return server


def stop_servers() -> None:
    """Stop every server this process started (idempotent; a later episode starts its server anew)."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
        _CHECKED.clear()
        _SESSIONS.clear()  # the next run learns each server's capacity again
        _CAPACITY.clear()
        _ANNOUNCED.clear()
    for server in servers:
        server.stop()


register_release(stop_servers)
atexit.register(stop_servers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# URLs (and field sets) already checked in this process: every episode builds an adapter, and only the
# first of a run need ask the server.
_CHECKED: set[str] = set()


def _get(url: str, timeout_s: float) -> bytes:
    """GET `url`'s body; `OSError` (`urllib.error.URLError`/`HTTPError` among them) if not a 2xx answer.
    The standard library's client: httpx would log every poll of a starting server at INFO."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read()


def _check_server(url: str, fields: dict[str, list[str]], timeout_s: float) -> None:
    """One line if the server at `url` is not there or lacks a field the args name."""
    key = json.dumps([url, fields])
    if key in _CHECKED:
        return
    try:
        _get(f"{url}/health", timeout_s)
        schema = json.loads(_get(f"{url}/schema", timeout_s))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"the OpenEnv server at {url} is unreachable: GET {url}/health and /schema failed: "
            f"{type(e).__name__}: {e}"
        ) from e
    # An MCP-style server's actions are call_tool/list_tools: that is env `openenv_mcp`'s to play.
    hint = "; an MCP-style server: env.name openenv_mcp" if "tool_name" in json.dumps(schema) else ""
    for part, names in fields.items():
        known = set(schema.get(part, {}).get("properties", {})) - {"metadata"}
        for name in names:
            if name not in known:
                raise ValueError(
                    f"env.args names {part} field {name!r}, but the server at {url} has {part} fields "
                    f"{sorted(known)} (its /schema){hint}"
                )
    _CHECKED.add(key)


# Each server's free sessions (by URL), shared by every episode of this process: a thread-safe counter,
# since async producers play episodes in several event loops.
_SESSIONS: dict[str, threading.BoundedSemaphore] = {}
_CAPACITY: dict[str, int] = {}
_ANNOUNCED: set[str] = set()  # pools said in one line already
_NEXT = 0  # round robin over a pool of servers whose capacity is unknown


async def _probe(url: str, reset_args: dict[str, Any], timeout_s: float) -> int | None:
    """How many sessions the server at `url` holds at once: opened one after another (each reset with
    `reset_args`) until one is refused, at most `_PROBE_SESSIONS`; None if not even one opens."""
    from openenv.core.generic_client import GenericEnvClient

    clients: list[Any] = []
    try:
        for _ in range(_PROBE_SESSIONS):
            client = GenericEnvClient(url, connect_timeout_s=timeout_s, message_timeout_s=timeout_s)
            try:
                await client.reset(**reset_args)
            except Exception:
                with contextlib.suppress(Exception):
                    await client.close()
                return len(clients) or None
            clients.append(client)
        return len(clients)
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()


def _session_slots(url: str, max_sessions: int | None, reset_args: dict[str, Any], timeout_s: float) -> Any:
    """The semaphore of the server's sessions (learnt once per URL), or None when its capacity is unknown."""
    with _LOCK:
        if url in _SESSIONS:
            return _SESSIONS[url]
    how = "env.args.max_sessions"
    if max_sessions is None:
        found: list[int | None] = []
        thread = threading.Thread(  # a loop of its own: set-up may run inside the rollout's event loop
            target=lambda: found.append(asyncio.run(_probe(url, reset_args, timeout_s))), daemon=True
        )
        thread.start()
        thread.join(timeout=timeout_s * 2)
        max_sessions, how = (found[0] if found else None), "probed"
    if max_sessions is None:
        log.warning("openenv: could not probe how many sessions %s serves; episodes are not limited", url)
        return None
    log.info(
        "openenv: the server at %s serves %d session(s) at once (%s): episodes beyond that wait for a free "
        "one%s",
        url,
        max_sessions,
        how,
        "" if max_sessions >= _PROBE_SESSIONS else " (raise its max_concurrent_envs to play more at once)",
    )
    with _LOCK:
        _CAPACITY[url] = max_sessions
        return _SESSIONS.setdefault(url, threading.BoundedSemaphore(max_sessions))


def _capacity(url: str) -> int | None:
    with _LOCK:
        return _CAPACITY.get(url)


def _pool_slots(url: str, capacity: int | None) -> Any:
    """The semaphore of a pool server whose capacity its first sibling told."""
    if capacity is None:
        return None
    with _LOCK:
        return _SESSIONS.setdefault(url, threading.BoundedSemaphore(capacity))


def first_of_run(url: str) -> bool:
    """True the first time a pool (named by its first server's URL) is seen this run: it is said once."""
    with _LOCK:
        first = url not in _ANNOUNCED
        _ANNOUNCED.add(url)
    return first


def next_turn() -> int:
    """A counter for spreading episodes over a pool of servers of unknown capacity."""
    global _NEXT
    with _LOCK:
        _NEXT += 1
        return _NEXT
