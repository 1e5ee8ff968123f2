"""Tool-call parsers: find the calls a model wrote in its text.

The default is the Hermes format (NousResearch's Hermes function calling, adopted by Qwen2.5/Qwen3
chat templates): each call is a JSON object `{"name": ..., "arguments": {...}}` between
`<tool_call>` and `</tool_call>`, several calls per message allowed, text outside the tags ignored.

A parser never raises on model output: whatever cannot be read as a call becomes a `ToolCallError`
in its place, which the environment turns into an error observation the model can learn from. A
parser is pluggable: anything with `parse(text) -> list[ToolCall | ToolCallError]`, or a name in
`PARSERS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from hone.registry import Registry


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallError:
    """A call the model attempted but wrote wrongly; `message` is shown to the model."""

    message: str
    raw: str


@runtime_checkable
class ToolCallParser(Protocol):
    def parse(self, text: str) -> list[ToolCall | ToolCallError]: ...


class HermesParser:
    """`<tool_call>{"name": "f", "arguments": {...}}</tool_call>`, in order of appearance.

    `arguments` may also be a JSON string holding an object (some models double-encode it, as OpenAI's
    API does). An opening tag with no closing tag is an error (typically a reply cut off by the token
    limit), and ends parsing.
    """

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str) -> list[ToolCall | ToolCallError]:
        calls: list[ToolCall | ToolCallError] = []
        pos = 0
        while (start := text.find(self.open_tag, pos)) != -1:
            body = start + len(self.open_tag)
            end = text.find(self.close_tag, body)
            if end == -1:
                calls.append(
                    ToolCallError(f"{self.open_tag} is never closed by {self.close_tag}", text[start:])
                )
                break
            calls.append(decode_call(text[body:end]))
            pos = end + len(self.close_tag)
        return calls


def decode_call(raw: str) -> ToolCall | ToolCallError:
    """One call from its JSON text: an object with a string `name` and an object `arguments`."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested past the stack
        return ToolCallError(f"tool call is not valid JSON ({_short(exc)})", raw)
    if not isinstance(obj, dict):
        return ToolCallError('tool call must be a JSON object {"name": ..., "arguments": {...}}', raw)
    name, arguments = obj.get("name"), obj.get("arguments")
    if not isinstance(name, str) or not name:
        return ToolCallError('tool call needs a string "name"', raw)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return ToolCallError(f'"arguments" of {name!r} is a string that is not a JSON object', raw)
    if not isinstance(arguments, dict):
        return ToolCallError(f'tool call {name!r} needs an object "arguments"', raw)
    return ToolCall(name, arguments)


def _short(exc: BaseException) -> str:
    return str(exc).split("\n", 1)[0][:120] or type(exc).__name__


PARSERS: Registry[Callable[[], ToolCallParser]] = Registry("tool-call parser")
PARSERS.register("hermes")(HermesParser)


def get_parser(parser: str | ToolCallParser) -> ToolCallParser:
    """A parser by registered name, or the given parser object as is."""
    if isinstance(parser, str):
        if parser not in PARSERS:
            raise ValueError(f"unknown tool-call parser {parser!r}; registered: {', '.join(sorted(PARSERS))}")
        return PARSERS[parser]()
    if not isinstance(parser, ToolCallParser):
        raise ValueError(f"a tool-call parser needs a parse(text) method, got {type(parser).__name__}")
    return parser
