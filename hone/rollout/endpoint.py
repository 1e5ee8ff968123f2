"""A local OpenAI-compatible chat-completions server in front of a `Sampler`, recording every token it serves.

Agent programs written against the OpenAI API (plain `openai` client, tool-calling loops) run unmodified:
each episode gets its own base URL, `http://127.0.0.1:<port>/e/<episode id>/v1`, so the episode id travels
in the path and client code needs no header or extra field. The server renders the request's `messages`
(and `tools=`) through the tokenizer's chat template, samples from the sampler, parses tool calls from the
output in the template's format (Hermes `<tool_call>` by default, `hone.envs.parsers`) and returns them as
OpenAI `tool_calls`. Only the HTTP is here: each request is one `Model.chat` call (`rollout/episodes.py`),
which records it token-exactly in the episode's `Trajectory`s and samples through the one `Batcher`
in front of the `Sampler`, so the HF sampler, vLLM or a remote engine serve the same way.

Token-exact trajectories (where this departs from a plain OpenAI server): a request whose rendered
conversation extends, as text, what an earlier completion of the same episode left in the context is
*not* re-tokenised. The sampler is given that context's exact token ids (its prompt and every sampled
token, as sampled) plus the tokens of the new text only (tool results, the next user message, the
template's markup), so a multi-turn episode is one token sequence in which exactly the sampled tokens
are trained on (verl and AReaL call the alternative's mismatch "re-tokenisation drift"). To get there,
an assistant message the agent sends back that this episode served (same content and tool calls) is
rendered as the raw text the model sampled, not as the template would re-render parsed `tool_calls`, and
with the special tokens it sampled (a `<pad>` mid-reply), which the served `content` drops: rendered
without them, the reply would not extend the recorded context and the episode would split. A request that
does not extend any earlier context (the agent rewrote its history, or the template rewrites past turns,
e.g. drops reasoning) starts a new sequence ("segment") of the episode.

What a request may ask (`chat_request.py`): `tool_choice` required or named is checked on the reply, not
forced on the sampler: a reply without the call is refused with a 422 and counted, but stays recorded;
`parallel_tool_calls: false` returns the first call only (the rest counted). Unsupported fields get a 400
naming them.

Sampling follows the run, not the request: `temperature`, `top_p` and `top_k` come from the episode's
`SamplingParams` (the trainer's log-probs assume the recipe's temperature, so a request asking for another
one is served with the recipe's); a request's `max_tokens`/`max_completion_tokens` may only lower the
episode's cap on new tokens, and its `stop` strings are added to the recipe's. `n` must be 1 (the run
samples `rollout.n` episodes per prompt) and `stream` must be false: either is refused with a 400.

Concurrency: requests from all episodes are queued and, after `batch_wait_s` of collecting, sent to the
sampler in one `generate` call (grouped by their sampling parameters; the batcher's window mode), on one
generation thread; at most `max_in_flight` requests are admitted at once. Requests of one episode are
served one after another (the trajectory is one sequence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web
from transformers import PreTrainedTokenizerBase

from hone.envs.parsers import ToolCall, ToolCallParser, get_parser
from hone.rollout.base import Sampler
from hone.rollout.batcher import Batcher
from hone.rollout.chat_request import ChatRequest, RequestError, read_request
from hone.rollout.episodes import ChatTemplateError, Model
from hone.rollout.trajectory import Completion, Trajectory
from hone.types import SamplingParams

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


@dataclass
class EpisodeRecord:
    """Everything served to one episode, in order, and what its requests may do."""

    params: SamplingParams
    max_completions: int
    segments: list[Trajectory] = field(default_factory=list)
    served: dict[str, str] = field(default_factory=dict)  # returned message key -> sampled raw text
    # What the endpoint counted for the run's metrics: env/tool_choice_violations, env/dropped_tool_calls.
    counts: dict[str, float] = field(
        default_factory=lambda: {"env/tool_choice_violations": 0.0, "env/dropped_tool_calls": 0.0}
    )
    lock: asyncio.Lock | None = None  # made in the server's loop on first use

    @property
    def completions(self) -> int:
        return sum(len(s.completions) for s in self.segments)


class EndpointServer:
    """`/v1/chat/completions` and `/v1/models` under `/e/<episode id>/`, on a thread with its own event loop.

    `open_episode` registers an episode (its sampling parameters and completion cap) and returns its base
    URL; `close_episode` ends it and returns its record; `close` stops the server and its threads."""

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_name: str = "hone-policy",
        parser: str | ToolCallParser = "hermes",
        host: str = "127.0.0.1",
        port: int = 0,
        batch_wait_s: float = 0.005,
        max_batch: int = 256,
        max_in_flight: int = 256,
    ) -> None:
        self.sampler, self.tokenizer = sampler, tokenizer
        self.model_name = model_name
        self.parser = get_parser(parser)
        self.batch_wait_s, self.max_batch, self.max_in_flight = batch_wait_s, max_batch, max_in_flight
        self._episodes: dict[str, EpisodeRecord] = {}
        self._episodes_lock = threading.Lock()
        try:
            self._sock = socket.create_server((host, port))
        except OSError as e:
            raise OSError(f"agent endpoint: cannot listen on {host}:{port} (rollout.agent_port): {e}") from e
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hone-endpoint-generate")
        self.port = self._sock.getsockname()[1]
        self.host = host
        self._thread = threading.Thread(target=self._loop.run_forever, name="hone-endpoint", daemon=True)
        self._runner: web.AppRunner | None = None
        # Agent programs' requests arrive at any time: the batcher collects them for `batch_wait_s`.
        batcher = Batcher(sampler, window_s=batch_wait_s, max_batch=max_batch, pool=self._pool)
        self.model = Model(batcher, tokenizer)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=_START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    # --- the run's side (any thread) ---

    def base_url(self, episode_id: str) -> str:
        return f"http://{self.host}:{self.port}/e/{episode_id}/v1"

    def open_episode(self, params: SamplingParams, max_completions: int) -> str:
        """Register a new episode; returns its id (its base URL is `base_url(id)`)."""
        episode_id = uuid.uuid4().hex
        with self._episodes_lock:
            self._episodes[episode_id] = EpisodeRecord(params, max_completions)
        return episode_id

    def close_episode(self, episode_id: str) -> EpisodeRecord:
        """End an episode: later requests for it get a 404. Returns what it was served."""
        with self._episodes_lock:
            return self._episodes.pop(episode_id)

    def close(self) -> None:
        """Stop serving and join the server thread (at most `_STOP_TIMEOUT_S`); safe to call twice."""
        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=_STOP_TIMEOUT_S)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=_STOP_TIMEOUT_S)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()
        self._sock.close()
        # Queued generate calls are dropped; one already running cannot be interrupted (a torch call), so
        # it is waited for, at most `_STOP_TIMEOUT_S` (then its daemon thread ends with its call).
        self._pool.shutdown(wait=False, cancel_futures=True)
        waiter = threading.Thread(target=self._pool.shutdown, name="hone-endpoint-stop", daemon=True)
        waiter.start()
        waiter.join(timeout=_STOP_TIMEOUT_S)

    def __enter__(self) -> EndpointServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the server's loop ---

    async def _start(self) -> None:
        self._admit = asyncio.Semaphore(self.max_in_flight)
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes(
            [
                web.post("/e/{episode}/v1/chat/completions", self._chat),
                web.get("/e/{episode}/v1/models", self._models),
                web.get("/v1/models", self._models),
                web.post("/v1/chat/completions", self._no_episode),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        # Requests still open at close (an agent that timed out) get at most this long to finish.
        await web.SockSite(self._runner, self._sock, shutdown_timeout=1.0).start()

    async def _stop(self) -> None:
        await self.model.batcher.aclose()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "hone"}
        return web.json_response({"object": "list", "data": [model]})

    async def _no_episode(self, request: web.Request) -> web.Response:
        return _error(
            404,
            "no episode in the URL: point the client at the episode's base_url "
            "(http://HOST:PORT/e/<episode id>/v1), which Hone passes to the agent",
        )

    async def _chat(self, request: web.Request) -> web.Response:
        episode_id = request.match_info["episode"]
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        async with self._admit:
            try:
                return web.json_response(await self._complete(episode_id, body))
            except RequestError as e:
                return _error(e.status, str(e), e.code)

    async def _complete(self, episode_id: str, body: Any) -> dict[str, Any]:
        with self._episodes_lock:
            episode = self._episodes.get(episode_id)
        if episode is None:
            raise RequestError(404, f"unknown or finished episode {episode_id!r}", "episode_not_found")
        request = read_request(body)
        if episode.lock is None:
            episode.lock = asyncio.Lock()
        async with episode.lock:
            if episode.completions >= episode.max_completions:
                raise RequestError(
                    400,
                    f"episode has used its {episode.max_completions} completions "
                    "(rollout.agent_max_completions)",
                    "episode_limit",
                )
            rendered = [_as_sampled(m, episode.served) for m in request.messages]
            cap = request.max_tokens
            params = replace(
                episode.params,
                n=1,
                max_new_tokens=min(cap or episode.params.max_new_tokens, episode.params.max_new_tokens),
                stop=sorted(set(episode.params.stop) | set(request.stop)),
            )
            try:
                completion = await self.model.chat(
                    episode.segments, rendered, request.tools, params, episode_id
                )
            except ChatTemplateError as e:
                raise RequestError(400, str(e)) from e
            except Exception as e:  # the sampler failed: every request of its call gets a 500
                raise RequestError(500, f"generation failed: {e}", "server_error") from e
            with self._episodes_lock:
                if episode_id not in self._episodes:  # the agent timed out and was closed meanwhile
                    raise RequestError(404, f"episode {episode_id!r} ended", "episode_not_found")
            message = self._message(completion, params.stop, request, episode)
            episode.served[_message_key(message)] = self._sampled_text(completion)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls"
                    if message.get("tool_calls")
                    else ("length" if completion.finish_reason == "length" else "stop"),
                    "logprobs": self._logprobs(completion) if request.logprobs else None,
                }
            ],
            "usage": {
                "prompt_tokens": len(completion.prompt_ids),
                "completion_tokens": len(completion.completion_ids),
                "total_tokens": len(completion.prompt_ids) + len(completion.completion_ids),
            },
        }

    def _logprobs(self, c: Completion) -> dict[str, Any]:
        """OpenAI's `choices[].logprobs`: each sampled token with the sampler's log-prob of it (the
        behaviour log-prob Hone trains with), as `logprobs: true` asks."""
        content = []
        for token_id, logprob in zip(c.completion_ids, c.logprobs, strict=True):
            token = str(self.tokenizer.decode([token_id]))
            content.append(
                {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
            )
        return {"content": content}

    def _message(
        self, c: Completion, stop: list[str], request: ChatRequest, episode: EpisodeRecord
    ) -> dict[str, Any]:
        """The OpenAI assistant message: text outside tool-call tags as `content`, calls as `tool_calls`
        (a call the model wrote wrongly stays in `content`, for the agent to see). A reply that breaks
        the request's `tool_choice` is refused (422) and counted; with `parallel_tool_calls: false` the
        calls after the first are dropped and counted (`chat_request.py` says why)."""
        text = c.text
        for s in stop:  # OpenAI leaves the stop sequence out of the content
            if s in text:
                text = text[: text.index(s)]
        # tool_choice none offered no tools: a call the model writes anyway is text, not a call to run.
        parsed = [] if request.tool_choice == "none" else self.parser.parse(text)
        calls = [call for call in parsed if isinstance(call, ToolCall)]
        if (why := request.violation(calls)) is not None:
            # The completion is already in the trajectory: the policy wrote it, so it stays recorded.
            episode.counts["env/tool_choice_violations"] += 1
            raise RequestError(422, why, "tool_choice_violated")
        if not request.parallel_tool_calls and len(calls) > 1:
            episode.counts["env/dropped_tool_calls"] += len(calls) - 1
            calls = calls[:1]
        if not calls:
            return {"role": "assistant", "content": text}
        content = _outside_calls(text, self.parser).strip()
        return {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for call in calls
            ],
        }

    def _sampled_text(self, c: Completion) -> str:
        """What the model wrote, as the next request's copy of this reply is rendered: its tokens decoded
        *with* special tokens (a `<pad>` sampled mid-reply is in the trajectory's text, so a rendering
        without it would not extend it and the episode would split), except a closing end-of-turn token,
        which the template writes itself after the content."""
        ids = c.completion_ids
        if ids and ids[-1] in self.model.eos_token_ids:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))


def _message_key(message: dict[str, Any]) -> str:
    """What identifies an assistant message the server returned, as the agent sends it back."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # kept as the string it is
                arguments = json.loads(arguments)
        calls.append([function.get("name"), arguments])
    return json.dumps([message.get("content") or "", calls], sort_keys=True)


def _as_sampled(message: dict[str, Any], served: dict[str, str]) -> dict[str, Any]:
    """An assistant message this episode was served, as the raw text the model sampled (so the template
    renders what the model wrote, not its own re-rendering of parsed tool calls); others unchanged."""
    if message.get("role") == "assistant":
        raw = served.get(_message_key(message))
        if raw is not None:
            return {"role": "assistant", "content": raw}
    return message


def _outside_calls(text: str, parser: ToolCallParser) -> str:
    """`text` without its tool-call blocks (for parsers with open/close tags; otherwise unchanged)."""
    open_tag, close_tag = getattr(parser, "open_tag", None), getattr(parser, "close_tag", None)
    if not open_tag or not close_tag:
        return text
    kept, pos = [], 0
    while (start := text.find(open_tag, pos)) != -1 and (end := text.find(close_tag, start)) != -1:
        kept.append(text[pos:start])
        pos = end + len(close_tag)
    return "".join(kept) + text[pos:]


def _error(status: int, message: str, code: str = "invalid_request_error") -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": code, "param": None, "code": code}}, status=status
    )
