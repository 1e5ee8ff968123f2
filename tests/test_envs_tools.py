"""Tools (schemas, validation, built-ins) and `ToolEnv` (errors as observations, timeouts, concurrency)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time

import pytest

from hone.envs import (
    StepResult,
    Tool,
    ToolEnv,
    ToolError,
    calculator,
    python_tool,
    run_tool,
    search_tool,
    sql_tool,
)
from hone.types import Sample
from tests.conftest import needs_sandbox


def lookup(city: str, days: int = 1, metric: bool | None = None) -> str:
    """Look up the weather forecast.

    Args:
        city: The city name.
        days: How many days ahead.
        metric: Whether to use metric units.
    """
    return f"{city}:{days}:{metric}"


# --- schemas and validation ---


def test_schema_from_typed_docstringed_function():
    tool = Tool.from_function(lookup, timeout_s=3)
    assert (tool.name, tool.description, tool.timeout_s) == ("lookup", "Look up the weather forecast.", 3)
    assert tool.schema["type"] == "function"
    params = tool.schema["function"]["parameters"]
    assert params["required"] == ["city"]
    assert params["properties"]["city"] == {"type": "string", "description": "The city name."}
    assert params["properties"]["days"]["type"] == "integer"


def test_function_without_hints_or_docstring_is_rejected():
    def bare(x):
        return x

    with pytest.raises(ValueError, match="type hints"):
        Tool.from_function(bare)


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "missing required argument(s) city"),
        ({"city": "Oslo", "when": 1}, "unknown argument(s) when"),
        ({"city": 3}, "city must be of type string, got integer"),
        ({"city": "Oslo", "days": "2"}, "days must be of type integer, got string"),
        ({"city": "Oslo", "days": True}, "days must be of type integer, got boolean"),
        ({"city": "Oslo", "days": 1.5}, "days must be of type integer"),
    ],
)
def test_validation_errors(arguments, fragment):
    tool = Tool.from_function(lookup)
    with pytest.raises(ToolError) as err:
        tool.validate(arguments)
    assert fragment in str(err.value)


def test_validation_accepts_good_arguments_and_null_for_optional():
    tool = Tool.from_function(lookup)
    tool.validate({"city": "Oslo", "days": 2, "metric": None})
    assert run_tool(tool, {"city": "Oslo", "metric": True}) == "Oslo:1:True"


def test_run_tool_turns_exceptions_into_tool_errors_and_formats_results():
    def boom(x: int) -> int:
        """Divide.

        Args:
            x: Divisor.
        """
        return {"a": 1 // x}  # type: ignore[return-value]

    tool = Tool.from_function(boom)
    assert json.loads(run_tool(tool, {"x": 1})) == {"a": 1}
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        run_tool(tool, {"x": 0})


# --- calculator ---


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("4521*37", "167277"),
        ("(12 + 3) * 4 / 5", "12"),
        ("7 / 2", "3.5"),
        ("0.1 + 0.2", "0.3"),
        ("-2 ** 2", "-4"),
        ("(-2) ** 3", "-8"),
        ("17 // 5", "3"),
        ("17 % 5", "2"),
        ("2 ** -1", "0.5"),
        ("+5", "5"),
        ("2 ** 100", str(2**100)),
    ],
)
def test_calculator_values(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("x + 1", "name 'x'"),
        ("__import__('os').system('true')", "function calls"),
        ("(1).__class__", "attribute access"),
        ("abs(-1)", "function calls"),
        ("2 ** 100000", "exponent"),
        ("9 ** 9 ** 9", "exponent"),
        ("10 ** 5000", "too large"),
        ("(10 ** 1000) * (10 ** 1000) * (10 ** 1000)", "too large"),
        ("1e308 * 10", "too large"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("(-8) ** 0.5", "not a real number"),
        ("2 ^ 3", "use **"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j", "only numbers"),
        ("1 +", "cannot parse"),
        ("[1, 2]", "not allowed"),
        ("1 < 2", "not allowed"),
        ("1" * 600, "longer than"),
        ("-" * 400 + "1", ""),  # deep but legal, or cleanly rejected: never a crash
    ],
)
def test_calculator_rejects(expression, fragment):
    try:
        result = calculator(expression)
    except ToolError as err:
        assert fragment in str(err)
    else:
        assert fragment == "" and result in ("1", "-1")


def test_calculator_huge_exponent_is_fast():
    start = time.monotonic()
    for expression in ("2 ** 10000", "123456789 ** 9999", "9 ** 9 ** 9"):
        with pytest.raises(ToolError):
            calculator(expression)
    assert time.monotonic() - start < 10  # refused before computing: 9 ** 9 ** 9 alone would take hours


# --- sql ---


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "shop.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE items (name TEXT, price REAL);"
        "INSERT INTO items VALUES ('apple', 0.5), ('pear', 0.75), ('plum', NULL);"
    )
    conn.commit()
    conn.close()
    return path


def test_sql_select(database):
    tool = sql_tool(str(database))
    out = run_tool(tool, {"query": "SELECT name, price FROM items ORDER BY name"})
    assert out.splitlines() == ["name | price", "apple | 0.5", "pear | 0.75", "plum | NULL"]
    assert "(no rows)" in run_tool(tool, {"query": "SELECT * FROM items WHERE price > 9"})


def test_sql_row_limit(database):
    out = run_tool(sql_tool(str(database), max_rows=2), {"query": "SELECT name FROM items"})
    assert out.splitlines()[1:] == ["apple", "pear", "(only the first 2 rows shown)"]


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM items",
        "INSERT INTO items VALUES ('fig', 1)",
        "DROP TABLE items",
        "UPDATE items SET price = 0",
        "CREATE TABLE t (x)",
        "PRAGMA query_only = OFF",
        "ATTACH DATABASE ':memory:' AS other",
        "SELECT 1; DELETE FROM items",
    ],
)
def test_sql_writes_fail_and_leave_the_file_unchanged(database, query):
    before = database.read_bytes()
    with pytest.raises(ToolError):
        run_tool(sql_tool(str(database)), {"query": query})
    assert database.read_bytes() == before
    assert "3" in run_tool(sql_tool(str(database)), {"query": "SELECT count(*) FROM items"})


def test_sql_write_error_says_read_only(database):
    with pytest.raises(ToolError, match="read-only"):
        run_tool(sql_tool(str(database)), {"query": "DELETE FROM items"})


def test_sql_runaway_query_is_stopped(database):
    tool = sql_tool(str(database), time_limit_s=0.3)
    query = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    start = time.monotonic()
    with pytest.raises(ToolError, match="too long"):
        run_tool(tool, {"query": query})
    assert time.monotonic() - start < 10  # stopped: the query alone never ends


def test_sql_missing_file_fails_at_setup(tmp_path):
    with pytest.raises(ValueError, match="no database file"):
        sql_tool(str(tmp_path / "none.db"))


# --- search ---

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "Python is a high-level programming language created by Guido van Rossum.",
    "The Great Wall of China stretches thousands of kilometres across northern China.",
    "Photosynthesis converts light energy into chemical energy in plants.",
]


def test_search_returns_the_relevant_document_first():
    tool = search_tool(DOCS, k=2)
    out = run_tool(tool, {"query": "who created the Python programming language"})
    assert out.splitlines()[0] == f"[1] {DOCS[1]}"
    assert run_tool(tool, {"query": "Great Wall China"}).startswith("[2] ")


def test_search_no_match():
    tool = search_tool(DOCS)
    assert run_tool(tool, {"query": "zebra quantum"}) == "No results."
    assert run_tool(tool, {"query": "the of and"}) == "No results."  # only stopwords
    with pytest.raises(ValueError):
        search_tool([])


# --- python (sandboxed) ---


@needs_sandbox
def test_python_tool_runs_in_the_sandbox():
    tool = python_tool(timeout_s=5)
    assert run_tool(tool, {"code": "print(6 * 7)"}).strip() == "42"
    out = run_tool(tool, {"code": "import os; print(os.getcwd()); raise SystemExit('bye')"})
    assert "stderr" in out and "bye" in out
    assert run_tool(tool, {"code": "x = 1"}) == "(no output)"


@needs_sandbox
def test_python_tool_timeout_note():
    out = run_tool(
        python_tool(timeout_s=0.5), {"code": "import time\nprint('start', flush=True)\ntime.sleep(30)"}
    )
    assert "start" in out and "timed out" in out


# --- ToolEnv ---


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def nap(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"


class AddEnv(ToolEnv):
    def __init__(self, tools: list[Tool] | None = None, **kwargs) -> None:
        super().__init__(tools or [Tool.from_function(add), Tool.from_function(nap, timeout_s=0.3)], **kwargs)
        self.answer = ""

    def reset(self, sample: Sample) -> list[dict]:
        self.answer = sample.answer or ""
        return [{"role": "user", "content": sample.prompt}]

    def finish(self, final_message: str) -> StepResult:
        return StepResult([], reward=float(final_message.strip() == self.answer), done=True)


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _step(env: ToolEnv, text: str) -> StepResult:
    return asyncio.run(env.step(text))


def test_tool_env_runs_a_call_and_finishes():
    env = AddEnv()
    assert [t["function"]["name"] for t in env.tools] == ["add", "nap"]
    env.reset(Sample(id="0", prompt="2+3?", answer="5"))
    result = _step(env, "thinking " + _call("add", a=2, b=3))
    assert result.messages == [{"role": "tool", "name": "add", "content": "5"}]
    assert not result.done and result.reward == 0.0
    assert result.info == {"tool_calls": 1.0, "tool_errors": 0.0, "tool_timeouts": 0.0}
    final = _step(env, "5")
    assert final.done and final.reward == 1.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}', "never closed"),
        (_call("subtract", a=1, b=2), "unknown tool 'subtract'; available: add, nap"),
        (_call("add", a=1), "missing required argument(s) b"),
        (_call("add", a=1, b="2"), "b must be of type integer"),
        (_call("add", a=1, b=2, c=3), "unknown argument(s) c"),
    ],
)
def test_bad_calls_become_counted_error_observations(text, fragment):
    env = AddEnv()
    result = _step(env, text)
    (message,) = result.messages
    assert message["role"] == "tool" and message["content"].startswith("Error: ")
    assert fragment in message["content"]
    assert not result.done
    assert result.info["tool_calls"] == 1.0 and result.info["tool_errors"] == 1.0


def test_good_and_bad_calls_in_one_turn_keep_order():
    result = _step(AddEnv(), _call("add", a=1, b=1) + _call("nope") + _call("add", a=2, b=2))
    assert [m["content"][:6] for m in result.messages] == ["2", "Error:", "4"]
    assert result.info["tool_errors"] == 1.0


def test_too_many_calls_in_one_turn():
    result = _step(AddEnv(max_calls_per_turn=2), _call("add", a=1, b=1) * 3)
    assert [m["content"] for m in result.messages[:2]] == ["2", "2"]
    assert "at most 2 tool calls" in result.messages[2]["content"]
    assert result.info == {"tool_calls": 3.0, "tool_errors": 1.0, "tool_timeouts": 0.0}


def test_slow_tool_times_out_within_its_timeout():
    start = time.monotonic()
    result = _step(AddEnv(), _call("nap", seconds=3))
    elapsed = time.monotonic() - start
    assert elapsed < 0.3 + 2.2  # not the nap's 3 s
    assert result.messages == [{"role": "tool", "name": "nap", "content": "Error: nap timed out after 0.3 s"}]
    assert result.info["tool_timeouts"] == 1.0 and result.info["tool_errors"] == 0.0


def test_async_tool_timeout_cancels_it():
    cancelled = []

    async def wait(seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "done"

    env = AddEnv([Tool.from_function(wait, timeout_s=0.2)])
    assert _step(env, _call("wait", seconds=0.01)).messages[0]["content"] == "done"
    result = _step(env, _call("wait", seconds=5))
    assert "timed out" in result.messages[0]["content"] and cancelled == [True]


def test_calls_in_one_turn_run_concurrently():
    barrier = threading.Barrier(2, timeout=5)  # two serial calls would each wait alone and break it

    def meet(tag: str) -> str:
        """Wait for the other call.

        Args:
            tag: Returned as is.
        """
        barrier.wait()
        return tag

    env = AddEnv([Tool.from_function(meet, timeout_s=3)])
    result = _step(env, _call("meet", tag="x") + _call("meet", tag="y"))
    assert [m["content"] for m in result.messages] == ["x", "y"]
    assert result.info["tool_errors"] == 0.0 and result.info["tool_timeouts"] == 0.0


def test_duplicate_tool_names_rejected():
    with pytest.raises(ValueError, match="unique"):
        AddEnv([Tool.from_function(add), Tool.from_function(add)])


def test_instances_do_not_share_state():
    one, two = AddEnv(), AddEnv()
    one.reset(Sample(id="1", prompt="?", answer="1"))
    two.reset(Sample(id="2", prompt="?", answer="2"))
    assert _step(one, "1").reward == 1.0
    assert _step(two, "1").reward == 0.0
    assert one.tools is not two.tools
