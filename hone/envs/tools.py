"""Tools: Python functions with type hints and a docstring, exposed to the model as JSON schemas.

`Tool.from_function(fn)` builds the OpenAI-style schema with `transformers.utils.get_json_schema`,
the same function chat templates' `tools=` argument uses, so what the prompt shows is exactly what
`validate` checks. The function needs type hints on every parameter and a Google-style docstring
with an `Args:` section.

Built-ins: `calculator` (a function; `calculator_tool()` wraps it), and factories `python_tool`
(runs code in `hone.verifiers.sandbox`), `search_tool` (BM25 over a document list, through bm25s) and
`sql_tool` (read-only SQLite). Every failure a model can cause surfaces as `ToolError`, whose message
becomes the tool's observation.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import operator
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

from hone.verifiers.sandbox import run_python


class ToolError(Exception):
    """A failure to report to the model as the tool's result (bad arguments, a bad query, ...)."""


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


@dataclass
class Tool:
    name: str
    description: str
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}
    fn: Callable[..., Any]  # sync, or async (then a timeout cancels it)
    timeout_s: float = 10.0

    @classmethod
    def from_function(cls, fn: Callable[..., Any], timeout_s: float = 10.0) -> Tool:
        try:
            schema = get_json_schema(fn)
        except Exception as exc:  # transformers' TypeHintParsingException / DocstringParsingException
            raise ValueError(
                f"tool {getattr(fn, '__name__', fn)!r}: {exc} (a tool needs type hints on every parameter "
                "and a Google-style docstring with an Args: section)"
            ) from exc
        spec = schema["function"]
        return cls(spec["name"], spec.get("description", ""), schema, fn, timeout_s)

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters", {"type": "object", "properties": {}})

    def validate(self, arguments: dict[str, Any]) -> None:
        """Raise `ToolError` unless `arguments` fit the schema: required present, no unknown names,
        top-level JSON types (and enums) right. Nested structure is left to the function."""
        properties: dict[str, Any] = self.parameters.get("properties", {})
        missing = [p for p in self.parameters.get("required", []) if p not in arguments]
        if missing:
            raise ToolError(f"{self.name}: missing required argument(s) {', '.join(missing)}")
        unknown = [a for a in arguments if a not in properties]
        if unknown:
            expected = ", ".join(properties) or "none"
            raise ToolError(f"{self.name}: unknown argument(s) {', '.join(unknown)}; expected: {expected}")
        for arg, value in arguments.items():
            _check_type(self.name, arg, value, properties[arg])


def select_tools(listed: list[str], keep: list[str] | dict[str, str] | None, where: str) -> dict[str, str]:
    """A tool server's tools as the recipe keeps them (`env.args.tools`): {server's name: name the policy
    sees}: all of `listed` by default, those a list names, or a dict's renames; unknown names: one line."""
    names = dict(keep) if isinstance(keep, dict) else {name: name for name in keep or listed}
    unknown = [name for name in names if name not in listed]
    if unknown:
        raise ValueError(
            f"env.args.tools names {unknown}, which {where} does not have; it has {sorted(listed)}"
        )
    return names


def _check_type(tool: str, arg: str, value: Any, spec: dict[str, Any]) -> None:
    if value is None and spec.get("nullable"):
        return
    types = spec.get("type")
    types = [types] if isinstance(types, str) else types or []
    if types and not any(_JSON_TYPES.get(t, lambda _: True)(value) for t in types):
        raise ToolError(
            f"{tool}: argument {arg} must be of type {' or '.join(types)}, got {_json_type(value)}"
        )
    if "enum" in spec and value not in spec["enum"]:
        raise ToolError(f"{tool}: argument {arg} must be one of {spec['enum']}, got {value!r}")


def _json_type(value: Any) -> str:
    return next((t for t, check in _JSON_TYPES.items() if check(value)), type(value).__name__)


def run_tool(tool: Tool, arguments: dict[str, Any]) -> str:
    """Validate and call a sync tool; its result as text. Any failure is raised as `ToolError`."""
    tool.validate(arguments)
    try:
        return format_result(tool.fn(**arguments))
    except ToolError:
        raise
    except Exception as exc:  # the model's arguments broke the function: an observation, not a crash
        raise ToolError(f"{tool.name}: {type(exc).__name__}: {exc}") from exc


def format_result(result: Any) -> str:
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError):
        return str(result)


# --- calculator ---

_MAX_EXPRESSION_CHARS = 500
_MAX_INT_BITS = 4096  # ~1233 decimal digits: far beyond any answer, far below a slow computation
_MAX_EXPONENT = 10_000
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "(12 + 3) * 4 / 5".
    """
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolError(f"cannot parse expression: {type(exc).__name__}") from exc
    try:
        return _format_number(_evaluate(tree.body))
    except RecursionError as exc:
        raise ToolError("expression nested too deeply") from exc


def calculator_tool(timeout_s: float = 2.0) -> Tool:
    return Tool.from_function(calculator, timeout_s=timeout_s)


def _evaluate(node: ast.AST) -> int | float:
    """Walk the tree; only number literals and arithmetic operators exist (no names, calls, attributes)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise ToolError("division by zero") from exc
        except OverflowError as exc:
            raise ToolError("result too large") from exc
        return _check_value(value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise ToolError("^ is not a power here; use ** (e.g. 2**10)")
    raise ToolError(f"{_describe(node)} not allowed; only numbers and + - * / // % ** ( )")


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"name {node.id!r}"
    if isinstance(node, ast.Attribute):
        return "attribute access"
    if isinstance(node, ast.Call):
        return "function calls"
    return type(node).__name__


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > _MAX_EXPONENT:
        raise ToolError(f"exponent larger than {_MAX_EXPONENT}")
    # Bound the work before doing it: int ** int has at least (bits(base) - 1) * exponent bits.
    if not (isinstance(base, int) and isinstance(exponent, int)):
        return
    if (abs(base).bit_length() - 1) * exponent > _MAX_INT_BITS:
        raise ToolError("result too large")


def _check_value(value: Any) -> int | float:
    if isinstance(value, complex):
        raise ToolError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        raise ToolError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result too large")
    return value


def _format_number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # 8/2 -> "4", not "4.0"
    return format(value, ".12g")  # 0.1+0.2 -> "0.3"


# --- python ---


def python_tool(timeout_s: float = 5.0) -> Tool:
    """Run Python code in the reward sandbox; the observation is its stdout (+ stderr's tail)."""

    def python(code: str) -> str:
        """Run a Python program and return what it prints.

        Args:
            code: The program. Use print() to show results.
        """
        result = run_python(code, timeout_s=timeout_s)
        parts = [result.stdout]
        if result.stderr.strip():
            parts.append("stderr:\n" + result.stderr[-1000:])
        if result.timed_out:
            parts.append(f"(timed out after {timeout_s:g} s)")
        text = "\n".join(p for p in parts if p)
        return text or "(no output)"

    # The sandbox enforces its own limit; the tool's outer timeout only adds interpreter start-up.
    return Tool.from_function(python, timeout_s=timeout_s + 5.0)


# --- search ---


def search_tool(documents: list[str], k: int = 3, max_chars: int = 500) -> Tool:
    """BM25 search over `documents` (indexed once, here); returns the top `k` matches, best first."""
    import bm25s  # imported on use: only search environments need it

    if not documents:
        raise ValueError("search_tool needs at least one document")
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(documents, stopwords="en", show_progress=False), show_progress=False)

    def search(query: str) -> str:
        """Search the document collection.

        Args:
            query: Keywords to look for.
        """
        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        if not tokens:
            return "No results."
        scores = retriever.get_scores(tokens)
        ranked = sorted(range(len(documents)), key=lambda i: -scores[i])[:k]
        hits = [f"[{i}] {documents[i][:max_chars]}" for i in ranked if scores[i] > 0]
        return "\n".join(hits) or "No results."

    return Tool.from_function(search, timeout_s=5.0)


# --- sql ---

_SQL_READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}


def sql_tool(path: str, max_rows: int = 50, time_limit_s: float = 2.0) -> Tool:
    """Read-only SQL on the SQLite file at `path`. Three locks: the file is opened read-only
    (`mode=ro`), `PRAGMA query_only`, and an authorizer that allows nothing but reading (so no
    `ATTACH` of a writable file and no `PRAGMA` turning the others off)."""
    if not os.path.isfile(path):
        raise ValueError(f"sql_tool: no database file at {path!r}")
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"

    def sql(query: str) -> str:
        """Run one read-only SQL query (SQLite) on the database and return the rows.

        Args:
            query: A single SELECT statement.
        """
        with _read_only_connection(uri, time_limit_s) as conn:
            try:
                cursor = conn.execute(query)
                rows = cursor.fetchmany(max_rows + 1)
            except sqlite3.Error as exc:
                raise ToolError(_sql_message(exc)) from exc
            return _format_rows(cursor.description, rows, max_rows)

    return Tool.from_function(sql, timeout_s=time_limit_s + 3.0)


@contextlib.contextmanager
def _read_only_connection(uri: str, time_limit_s: float) -> Iterator[sqlite3.Connection]:
    """A fresh connection per call (a sqlite3 connection can't cross threads), closed on exit."""
    conn = sqlite3.connect(uri, uri=True, timeout=time_limit_s)
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)  # randomblob(1e9) and friends
        deadline = time.monotonic() + time_limit_s
        # A nonzero return interrupts the query: the only way to stop a `WITH RECURSIVE` loop.
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        conn.set_authorizer(
            lambda action, *_: sqlite3.SQLITE_OK if action in _SQL_READ_ACTIONS else sqlite3.SQLITE_DENY
        )
        yield conn
    finally:
        conn.close()


def _sql_message(exc: sqlite3.Error) -> str:
    text = str(exc)
    if "interrupted" in text:
        return "query took too long and was stopped"
    if "not authorized" in text or "readonly" in text or "query_only" in text:
        return f"the database is read-only; only SELECT queries are allowed ({text})"
    return f"SQL error: {text}"


def _format_rows(description: Any, rows: list[tuple[Any, ...]], max_rows: int) -> str:
    if description is None:
        return "(no result set)"
    lines = [" | ".join(col[0] for col in description)]
    lines += [" | ".join(_cell(v) for v in row) for row in rows[:max_rows]]
    if not rows:
        lines.append("(no rows)")
    elif len(rows) > max_rows:
        lines.append(f"(only the first {max_rows} rows shown)")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= 200 else text[:200] + "…"
