"""`openenv`: an environment served by an OpenEnv server (`openenv-core`, the `agents` extra), played
through the package's own client, one WebSocket session per trajectory.

OpenEnv (meta-pytorch; used by TRL and torchforge) serves a Gymnasium-style environment over
HTTP/WebSocket: `reset(**kwargs)` and `step(action)` each return an observation (a pydantic model,
sent as a dict) with `reward` and `done`. Hone's side is `reset(sample) -> messages` and
`step(text) -> StepResult`; this adapter maps one onto the other (README "OpenEnv environments"):

* where the server is: `url` (a running server), or Hone starts one: `app: pkg.mod:app` (run with
  uvicorn on a free port) or `command: [...]` (any program; `{port}` in it becomes the free port). A
  started server is shared by every episode of the run, waited on until `/health` answers
  (`start_timeout_s`), and stopped when the run ends (`release_envs`), when Python exits, and, through
  the kernel's parent-death signal, when the trainer is killed.
* reset: the sample's `meta` plus `reset_args` are the keyword arguments of the server's `reset` (that
  is how a sample's target, e.g. guess_number's secret, reaches the server); its observation becomes
  the initial messages. The sample's own prompt is not sent: the server states the task.
* the assistant's text becomes the action `{action_field: text}`, or `action: pkg.mod:fn` builds the
  action dict from the text (a function that parses a structured action; it should turn text it cannot
  parse into an action the server answers, since an exception is an environment error).
* an observation becomes one `role` message holding the `observation_field` text (nothing when empty),
  or `render: pkg.mod:fn` turns the observation dict into messages. `reward` None counts as 0;
  `info_fields` name numeric observation fields summed over the episode into `env/<name>` metrics.
* samples and SFT demonstrations: `samples: <a built-in game or pkg.mod:Class>` (+ `samples_args`)
  lends its `make_samples` and `demonstration`, e.g. `guess_number`'s games for its OpenEnv port; or
  give the recipe a dataset. `max_turns` is that environment's, unless `env.max_turns` says.

Sessions: an OpenEnv app serves at most `max_concurrent_envs` sessions at once (1 by default: 21 of
OpenEnv's 30 published apps keep it), and refuses more; Hone plays a batch's episodes at once. So at
set-up the adapter learns the server's capacity (`max_sessions`, or a probe: sessions opened one after
another until the server refuses one, at most `_PROBE_SESSIONS`), says it in one line, and an episode
waits for a free session before its reset (released at its close). For more at once without editing the
app: `servers: K` starts K copies of a started server (`app`/`command`; said in one line), each of the
first one's capacity, and an episode takes a free session on any of them.

Set-up checks (one line each, at recipe set-up): the server answers `/health`; `action_field` and
`observation_field`/`info_fields` are fields of the server's `/schema`. An error inside an episode (a
server error, a lost connection, a timeout of `timeout_s`) ends that episode and is counted in
`env/errors` by the rollout loop; a started server that has died stops the run with its last log lines.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from hone.envs.base import (
    Environment,
    LendsSamples,
    Message,
    StepResult,
    register_env,
    waiting_on_other_episodes,
)
from hone.envs.openenv_servers import (
    _capacity,
    _check_server,
    _pool_slots,
    _Server,
    _session_slots,
    _started_server,
    first_of_run,
    next_turn,
)
from hone.plugins import load_object
from hone.types import Sample

log = logging.getLogger("hone")


def _function(spec: str, what: str) -> Callable[..., Any]:
    fn = load_object(spec, what=f"env.args.{what}")
    if not callable(fn):
        raise ValueError(f"env.args.{what}: {spec!r} is not callable")
    return fn


@register_env("openenv")
class OpenEnv(LendsSamples, Environment):
    """An OpenEnv server's environment, one session per instance (one instance per trajectory, as Hone
    builds them); see the module docstring for the arguments and what maps to what."""

    _NAME: ClassVar[str] = "openenv"  # the registered name, for messages (`openenv_mcp` subclasses it)
    _SAMPLES_HINT: ClassVar[str] = "a game whose samples the server plays, e.g. guess_number"

    def __init__(
        self,
        url: str | None = None,
        app: str | None = None,
        command: list[str] | None = None,
        action_field: str = "message",
        action: str | None = None,
        observation_field: str = "message",
        render: str | None = None,
        role: str = "user",
        info_fields: list[str] | None = None,
        reset_args: dict[str, Any] | None = None,
        samples: str | None = None,
        samples_args: dict[str, Any] | None = None,
        start_timeout_s: float = 60.0,
        timeout_s: float = 60.0,
        max_sessions: int | None = None,
        servers: int = 1,
    ) -> None:
        if importlib.util.find_spec("openenv") is None:
            raise ValueError(
                f"env {self._NAME!r} needs openenv-core: pip install -e '.[openenv]' in a Hone clone"
            )
        given = [k for k, v in (("url", url), ("app", app), ("command", command)) if v]
        if len(given) != 1:
            raise ValueError(
                "env.args needs exactly one of url (a running OpenEnv server), app (pkg.mod:app, started "
                f"with uvicorn) or command (a list, '{{port}}' in it); got {given or 'none'}"
            )
        self.timeout_s = timeout_s
        self.action_field, self.observation_field, self.role = action_field, observation_field, role
        self.info_fields = list(info_fields or [])
        self.reset_args = dict(reset_args or {})
        self._build_action = None if action is None else _function(action, "action")
        self._render = None if render is None else _function(render, "render")
        self._lend(samples, samples_args)
        if servers < 1 or (servers > 1 and url is not None):
            raise ValueError(
                f"env.args.servers must be >= 1, and more than 1 only for a server Hone starts (app or "
                f"command), got {servers}{' with url' if url is not None else ''}"
            )
        self._server: _Server | None = None
        if url is not None:
            self.url = url.rstrip("/")
        else:
            if app is not None:
                if ":" not in app:
                    raise ValueError(f"env.args.app must be 'pkg.module:app', got {app!r}")
                argv = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "{port}"]
                argv += ["--log-level", "warning"]
            else:
                argv = [str(a) for a in command or []]
                if not any("{port}" in a for a in argv):
                    raise ValueError(
                        "env.args.command must contain '{port}', where Hone puts the free port it picked"
                    )
            pool = [_started_server(argv, start_timeout_s, i) for i in range(servers)]
            for server in pool:
                server.check_alive()
            self._server = pool[0]
            self.url = self._server.url
        self._check(min(timeout_s, 10.0))
        if max_sessions is not None and max_sessions < 1:
            raise ValueError(f"env.args.max_sessions must be >= 1, got {max_sessions}")
        slots = _session_slots(self.url, max_sessions, self.reset_args, min(timeout_s, 10.0))
        # Every server of a pool runs the same program: the first one's capacity is each one's.
        self._pool: list[tuple[str, Any]] = [(self.url, slots)]
        if servers > 1:
            capacity = None if slots is None else _capacity(self.url)
            self._pool += [(server.url, _pool_slots(server.url, capacity)) for server in pool[1:]]
            if first_of_run(pool[0].url):
                log.info("openenv: %d servers of `%s` started (env.args.servers)", servers, " ".join(argv))
        self._slots: Any = None
        self._client: Any = None

    def _check(self, timeout_s: float) -> None:
        """One line at set-up if the server lacks a field the args name (`openenv_mcp`: its tools)."""
        fields = {"action": [] if self._build_action else [self.action_field]}
        fields["observation"] = [*([] if self._render else [self.observation_field]), *self.info_fields]
        _check_server(self.url, fields, timeout_s)

    async def reset(self, sample: Sample) -> list[Message]:
        from openenv.core.generic_client import GenericEnvClient

        await self.close()
        url = await self._free_server()
        self._client = GenericEnvClient(
            url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s
        )
        result = await self._client.reset(**{**self.reset_args, **sample.meta})
        return self._messages(result.observation)

    async def step(self, assistant_message: str) -> StepResult:
        if self._client is None:
            raise RuntimeError("openenv: step before reset")
        if self._build_action is None:
            action = {self.action_field: assistant_message}
        else:
            action = self._build_action(assistant_message)
        result = await self._client.step(action)
        observation = result.observation
        # Only what happened, as the built-in games report it: a metric no episode of a step had is absent.
        info = {name: float(v) for name in self.info_fields if (v := observation.get(name))}
        reward = float(result.reward or 0.0)
        return StepResult(self._messages(observation), reward=reward, done=bool(result.done), info=info)

    async def close(self) -> None:
        client, self._client = self._client, None
        try:
            if client is not None:
                await client.close()
        finally:
            slots, self._slots = self._slots, None
            if slots is not None:
                slots.release()

    async def _free_server(self) -> str:
        """The URL of a server with a free session, held until `close` (servers of unknown capacity: the
        episodes are spread over the pool)."""
        unlimited = [url for url, slots in self._pool if slots is None]
        if unlimited:
            return unlimited[next_turn() % len(unlimited)]
        if url := self._take_session():
            return url
        async with waiting_on_other_episodes():  # only another episode's close frees one
            while not (url := self._take_session()):
                await asyncio.sleep(0.01)
        return url

    def _take_session(self) -> str | None:
        for url, slots in self._pool:
            if slots.acquire(blocking=False):
                self._slots = slots
                return url
        return None

    def _messages(self, observation: dict[str, Any]) -> list[Message]:
        if self._render is not None:
            rendered = self._render(observation)
            return [{"role": self.role, "content": rendered}] if isinstance(rendered, str) else list(rendered)
        if self.observation_field not in observation:
            raise ValueError(
                f"openenv: the observation has no field {self.observation_field!r} "
                f"(it has {sorted(observation)})"
            )
        value = observation[self.observation_field]
        if value is None or value == "":
            return []
        text = value if isinstance(value, str) else json.dumps(value)
        return [{"role": self.role, "content": text}]
