"""A chat-completions request to Hone's endpoint, read and checked: what it asks for, or one `RequestError`
naming the field it cannot have. Apart from `endpoint.py` so the server holds only the serving.

What a request may ask and what it gets (`docs/how-to/agents.md`, "What the endpoint honours"):
* `tool_choice`: `auto` (the default) or `none` (no tools offered: the template renders none, and a
  call the model writes anyway is returned as text), and
  `required` or a named function (`{"type": "function", "function": {"name": X}}`, X one of `tools`).
  Sampling is not constrained, so the policy may still answer without the call the request demands: the
  reply is then *refused*, a 422 whose message names `tool_choice`, and counted in
  `env/tool_choice_violations`. It stays recorded in the episode's trajectory (the sampled tokens are the
  policy's, trained on with the episode's reward if the agent goes on). A named choice is broken by a
  reply without a call to X and also by one calling any other tool.
* `parallel_tool_calls: false`: at most one tool call is returned, the first the model wrote; the rest
  are dropped from the response and counted in `env/dropped_tool_calls`. The trajectory keeps every
  token as sampled (the next request's copy of the reply, with its one call, is rendered as the text
  the model wrote, so the episode stays one sequence).
* `logprobs: true` returns each sampled token's log-prob from the sampler; `top_logprobs`,
  `response_format` other than text, `stream`, `n` > 1 and non-text content parts (`image_url`: images
  reach a vision-language model through an environment's observations, not this endpoint yet) are refused
  (400).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hone.envs.parsers import ToolCall


class RequestError(Exception):
    """A request the server refuses: becomes an OpenAI-style error body with `status`."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict] | None  # None: no tools offered (none given, or tool_choice none)
    max_tokens: int | None  # the request's cap on new tokens, if it set one
    stop: list[str]
    logprobs: bool
    tool_choice: str  # "auto", "none", "required" or "function" (a named one)
    tool_name: str | None  # the function tool_choice names
    parallel_tool_calls: bool

    def violation(self, calls: list[ToolCall]) -> str | None:
        """Why a reply with `calls` breaks the request's `tool_choice`, or None when it does not."""
        names = [c.name for c in calls]
        if self.tool_choice == "required" and not names:
            return "tool_choice is required but the model answered without a tool call"
        if self.tool_choice == "function":
            others = sorted(set(names) - {self.tool_name})
            if not names or others:
                wrote = f"called {', '.join(others)}" if others else "answered without a tool call"
                return f"tool_choice names the function {self.tool_name!r} but the model {wrote}"
        return None


def read_request(body: Any) -> ChatRequest:
    """The request `body` asks for, or a `RequestError` naming the field."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    if body.get("stream"):
        raise RequestError(400, "stream: true is not supported by Hone's endpoint; request without streaming")
    if body.get("n", 1) != 1:
        raise RequestError(400, "n must be 1: Hone samples rollout.n episodes per prompt, one choice each")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError(400, "messages must be a non-empty list of message objects")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError(400, "tools must be a list of tool objects")
    # Refused, never silently ignored: an agent relying on one would see answers it did not ask for.
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise RequestError(
            400,
            f"response_format {json.dumps(response_format)} is not supported by Hone's endpoint "
            "(free text only)",
        )
    if body.get("top_logprobs"):
        raise RequestError(400, "top_logprobs is not supported by Hone's endpoint (logprobs: true is)")
    tool_choice, tool_name = _tool_choice(body.get("tool_choice"), tools or [])
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise RequestError(400, f"parallel_tool_calls must be true or false, got {json.dumps(parallel)}")
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") != "text" for p in content
        ):
            kinds = sorted({str(p.get("type")) for p in content if isinstance(p, dict)} - {"text"})
            # Images are not dropped silently: the endpoint's token-exact splicing is text-only so far
            # (an environment's observations may hold images: hone.rollout.multiturn).
            raise RequestError(
                400,
                f"message content of type {', '.join(kinds)} is not supported (text only): the agent "
                "endpoint does not take images yet; an environment (env.name) may return image observations",
            )
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if cap is not None and (not isinstance(cap, int) or cap < 1):
        raise RequestError(400, f"max_tokens must be a positive integer, got {cap!r}")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop must be a string or a list of non-empty strings")
    return ChatRequest(
        messages=[_plain(m) for m in messages],
        tools=None if tool_choice == "none" else tools or None,  # none: the template renders no tools
        max_tokens=cap,
        stop=stop,
        logprobs=bool(body.get("logprobs")),
        tool_choice=tool_choice,
        tool_name=tool_name,
        parallel_tool_calls=parallel,
    )


def _tool_choice(choice: Any, tools: list[Any]) -> tuple[str, str | None]:
    """("auto" | "none" | "required" | "function", the named function or None), checked against `tools`."""
    if choice in (None, "auto", "none"):
        return choice or "auto", None
    functions = [t.get("function") for t in tools if isinstance(t, dict)]
    names = [f.get("name") for f in functions if isinstance(f, dict)]
    if choice == "required":
        if not names:
            raise RequestError(400, "tool_choice required needs tools: the request has none")
        return "required", None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise RequestError(
            400,
            f"tool_choice {json.dumps(choice)} is not one of auto, none, required or "
            '{"type": "function", "function": {"name": ...}}',
        )
    if name not in names:
        offered = ", ".join(str(n) for n in names) or "none"
        raise RequestError(400, f"tool_choice names the function {name!r}, not in tools (offered: {offered})")
    return "function", name


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates read it: content parts joined into one string, None fields dropped."""
    content = message.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = content or ""
    return out
