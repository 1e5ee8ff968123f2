"""Tool-call parsing: the Hermes format, its error cases, and fuzzing that it never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.envs import PARSERS, HermesParser, ToolCall, ToolCallError, get_parser

parse = HermesParser().parse


def test_single_call_with_surrounding_text():
    text = 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>\nDone.'
    assert parse(text) == [ToolCall("calc", {"x": 1})]


def test_several_calls_in_order():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {"q": "x"}}</tool_call>'
    )
    assert parse(text) == [ToolCall("a", {}), ToolCall("b", {"q": "x"})]


def test_no_call_is_an_empty_list():
    assert parse("The answer is 42.") == []
    assert parse("") == []
    assert parse("stray </tool_call> closing tag") == []


def test_arguments_as_json_string():
    text = '<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>'
    assert parse(text) == [ToolCall("a", {"x": 2})]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"name": "a", "arguments": {', "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"arguments": {}}', '"name"'),
        ('{"name": 3, "arguments": {}}', '"name"'),
        ('{"name": "", "arguments": {}}', '"name"'),
        ('{"name": "a"}', '"arguments"'),
        ('{"name": "a", "arguments": [1]}', '"arguments"'),
        ('{"name": "a", "arguments": "not json"}', "not a JSON object"),
        ('{"name": "a", "arguments": "[1]"}', '"arguments"'),
        ("[" * 100_000, "not valid JSON"),  # nesting past the recursion limit
    ],
)
def test_malformed_call_is_an_error(body, fragment):
    (result,) = parse(f"<tool_call>{body}</tool_call>")
    assert isinstance(result, ToolCallError)
    assert fragment in result.message
    assert result.raw == body


def test_unclosed_tag_is_an_error_after_the_good_calls():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "argu'
    good, bad = parse(text)
    assert good == ToolCall("a", {})
    assert isinstance(bad, ToolCallError) and "never closed" in bad.message


def test_registry_and_get_parser():
    assert isinstance(get_parser("hermes"), HermesParser)
    custom = HermesParser()
    assert get_parser(custom) is custom
    assert "hermes" in PARSERS
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'"):
        get_parser("nope")
    with pytest.raises(ValueError, match="parse"):
        get_parser(object())  # type: ignore[arg-type]


# --- fuzzing: whatever the model writes, the parser returns a list of calls/errors ---

_fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', '"arguments"', ":", ",", '"', "\\", "null"]
)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
_call_like = st.builds(
    lambda name, args, extra: json.dumps({"name": name, "arguments": args, **extra}),
    st.one_of(st.text(max_size=8), st.integers(), st.none()),
    _json_values,
    st.dictionaries(st.text(max_size=5), _json_values, max_size=2),
)


def _check(text: str) -> None:
    results = parse(text)
    assert isinstance(results, list)
    for r in results:
        assert isinstance(r, ToolCall | ToolCallError)
        if isinstance(r, ToolCall):
            assert isinstance(r.name, str) and r.name and isinstance(r.arguments, dict)
    assert len(results) <= text.count("<tool_call>")


@settings(derandomize=True, max_examples=200)
@given(st.lists(st.one_of(_fragments, st.text(max_size=12)), max_size=20))
def test_fuzz_fragments_never_raise(pieces):
    _check("".join(pieces))


@settings(derandomize=True, max_examples=200)
@given(st.text(max_size=30), _call_like, st.text(max_size=30), st.booleans())
def test_fuzz_json_in_tags_never_raises(before, body, after, closed):
    text = f"{before}<tool_call>{body}{'</tool_call>' if closed else ''}{after}"
    _check(text)


@settings(derandomize=True, max_examples=200)
@given(_call_like, st.integers(min_value=0, max_value=60))
def test_fuzz_truncated_json_never_raises(body, cut):
    _check(f"<tool_call>{body[:cut]}</tool_call>")
