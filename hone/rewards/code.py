"""Code reward: run the response's program against tests, in the sandbox.

The program is the *last* fenced code block of the response (```python … ``` or bare ``` … ```);
a response without one scores 0 — the response text itself is never executed. Two kinds of test,
which may be mixed:

* `{"input": str, "output": str}` — the program runs with `input` on stdin, in its own sandboxed
  process; it passes when it exits 0 and its stdout equals `output` after stripping trailing
  whitespace from every line and trailing blank lines (the usual competitive-programming judge).
* `{"assert": str}` — HumanEval/MBPP style: Python source run after the program, in the same
  namespace; passes when it raises nothing. All assert tests share one sandboxed process. The harness
  reports results with a random nonce the program never sees in its source or stdin, so `os._exit(0)`
  or printing a fake "all passed" earns nothing. What this cannot stop: a program that introspects its
  own interpreter (stack frames, `gc`) to find the nonce, or that returns objects whose `__eq__` is
  always true. Prefer stdin/stdout tests when the policy is strong enough to try that.

Score: `mode="all"` (default) gives 1.0 only when every test passes (the usual RLVR reward, e.g.
DeepSeek-R1's code rewards); `mode="fraction"` gives the share of passing tests (denser, but it
rewards partial solutions and is easier to game with special-casing).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from typing import Any, Literal

from hone.rewards.registry import register_reward
from hone.rewards.sandbox import Isolation, SandboxResult, run_python
from hone.types import Rollout, Sample

Mode = Literal["all", "fraction"]
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)

# Runs in the sandbox as the program. Everything it needs (program, tests, nonce) arrives on stdin,
# so reading its own source file teaches the program nothing.
_ASSERT_HARNESS = r"""
import json, os, sys, traceback
_cfg = json.loads(sys.stdin.read())
_report = os.fdopen(os.dup(1), "w")  # kept aside: the program may close or redirect stdout
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # and its prints can't push the report past the output cap
_ns = {"__name__": "__main__"}
try:
    exec(compile(_cfg["program"], "solution.py", "exec"), _ns)
    _ran = True
except SystemExit as e:
    _ran = e.code in (None, 0)
except BaseException:
    traceback.print_exc()
    _ran = False
_passed = []
for _i, _test in enumerate(_cfg["tests"]):
    try:
        if not _ran:
            raise RuntimeError("program failed")
        exec(compile(_test, f"<test {_i}>", "exec"), _ns)
        _passed.append("1")
    except BaseException:
        _passed.append("0")
_report.write(_cfg["nonce"] + " " + "".join(_passed) + "\n")
_report.flush()
"""


def extract_code(response: str) -> str | None:
    """The last fenced code block, or None. A `python`/`py` block is preferred over other languages."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3", "")]
    return python[-1] if python else None


def normalize_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def run_tests(
    program: str,
    tests: Sequence[dict[str, Any]],
    *,
    timeout_s: float = 5,
    memory_mb: int = 512,
    isolation: Isolation = "auto",
    stop_at_first_failure: bool = False,
) -> list[bool]:
    """Pass/fail of every test, in order. Raises ValueError for a malformed test (names its index)."""
    asserts = [(i, _check_test(i, t)) for i, t in enumerate(tests)]
    results: dict[int, bool] = {}
    assert_tests = [(i, src) for i, (kind, src) in asserts if kind == "assert"]
    if assert_tests:
        passed = _run_asserts(program, [src for _, src in assert_tests], timeout_s, memory_mb, isolation)
        results.update({i: ok for (i, _), ok in zip(assert_tests, passed, strict=True)})
        if stop_at_first_failure and not all(passed):
            return [results.get(i, False) for i in range(len(tests))]
    for i, test in enumerate(tests):
        if "assert" in test:
            continue
        result = run_python(program, str(test["input"]), timeout_s, memory_mb, isolation=isolation)
        results[i] = _io_passed(result, str(test["output"]))
        if stop_at_first_failure and not results[i]:
            break
    return [results.get(i, False) for i in range(len(tests))]


def code_reward(
    response: str,
    tests: list[dict[str, Any]],
    *,
    mode: Mode = "all",
    timeout_s: float = 5,
    memory_mb: int = 512,
    isolation: Isolation = "auto",
) -> float:
    """1.0 when the response's last code block passes every test (or the passing share, `fraction`)."""
    if not tests:
        raise ValueError("code_reward needs at least one test")
    program = extract_code(response)
    if program is None:
        return 0.0
    passed = run_tests(
        program,
        tests,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        isolation=isolation,
        stop_at_first_failure=mode == "all",
    )
    return float(all(passed)) if mode == "all" else sum(passed) / len(tests)


@register_reward("code")
def code(
    tests_field: str = "tests",
    mode: Mode = "all",
    timeout_s: float = 5,
    memory_mb: int = 512,
    isolation: Isolation = "auto",
) -> Any:
    """`reward.fn: code`: tests come from `sample.meta[tests_field]` (a list, or a JSON string of one)."""
    if mode not in ("all", "fraction"):
        raise ValueError(f"code reward mode must be 'all' or 'fraction', got {mode!r}")

    def reward(rollout: Rollout, sample: Sample) -> float:
        tests = sample.meta.get(tests_field)
        if isinstance(tests, str):
            tests = json.loads(tests)
        if not isinstance(tests, list) or not tests:
            raise ValueError(f"sample {sample.id!r}: meta[{tests_field!r}] must be a non-empty list of tests")
        return code_reward(
            rollout.response_text,
            tests,
            mode=mode,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            isolation=isolation,
        )

    return reward


def _check_test(index: int, test: object) -> tuple[str, str]:
    if isinstance(test, dict) and isinstance(test.get("assert"), str):
        return "assert", test["assert"]
    if isinstance(test, dict) and "input" in test and "output" in test:
        return "io", ""
    raise ValueError(
        f"test {index}: expected {{'input': str, 'output': str}} or {{'assert': str}}, got {test!r}"
    )


def _io_passed(result: SandboxResult, expected: str) -> bool:
    return (
        result.ok and not result.truncated and normalize_output(result.stdout) == normalize_output(expected)
    )


def _run_asserts(
    program: str, tests: list[str], timeout_s: float, memory_mb: int, isolation: Isolation
) -> list[bool]:
    nonce = secrets.token_hex(16)
    payload = json.dumps({"program": program, "tests": tests, "nonce": nonce})
    result = run_python(_ASSERT_HARNESS, payload, timeout_s, memory_mb, isolation=isolation)
    reports = [line for line in result.stdout.splitlines() if line.startswith(nonce + " ")]
    if result.timed_out or not reports:
        return [False] * len(tests)
    bits = reports[-1].split(" ", 1)[1]
    return [bit == "1" for bit in bits] if len(bits) == len(tests) else [False] * len(tests)
