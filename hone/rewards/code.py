"""Code reward: run the response's program against tests, in the sandbox.

The program is the *last* fenced code block of the response (```python … ``` or bare ``` … ```);
a response without one scores 0 — the response text itself is never executed. Two kinds of test,
which may be mixed:

* `{"input": str, "output": str}` — the program runs with `input` on stdin, in its own sandboxed
  process; it passes when it exits 0 and its stdout equals `output` after stripping trailing
  whitespace from every line and trailing blank lines (the usual competitive-programming judge).
* `{"assert": str}` — HumanEval/MBPP style: Python source run after the program, in the same
  namespace; passes when it raises nothing. All assert tests share one sandboxed process. The harness
  reports results with a random nonce that reaches it through a pipe (gone once read) and lives only
  in its own frame, with its own references to `exec`/`compile`: `os._exit(0)`, printing a fake
  "all passed", replacing builtins or editing module globals earn nothing. What this cannot stop: a
  program that introspects its own interpreter (walking stack frames, `gc`) to find the nonce or the
  tests, or that returns objects whose `__eq__` is always true. Prefer stdin/stdout tests when the
  policy is strong enough to try that.

Score: `mode="all"` (default) gives 1.0 only when every test passes (the usual RLVR reward, e.g.
DeepSeek-R1's code rewards); `mode="fraction"` gives the share of passing tests (denser, but it
rewards partial solutions and is easier to game with special-casing).

Time: each test runs under `timeout_s` (one process for all assert tests), and the tests of one call
share a budget of program run time: the component's timeout (`reward.timeout_s` or its own) less a
margin for process start-up and clean-up, or `total_timeout_s` when smaller. Tests left when it is
spent fail. Why: a call that outlives its timeout is left out of training as an infrastructure
failure, so without the budget a program whose tests all hang would escape its 0 (seven tests of 5 s
overrun the default 30 s). Many slow tests need a larger component timeout.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from typing import Any, Literal

from hone.rewards.registry import register_reward
from hone.types import Rollout, Sample
from hone.verifiers.budget import own_time_budget
from hone.verifiers.sandbox import _KILL_MARGIN_S as KILL_MARGIN_S
from hone.verifiers.sandbox import Isolation, SandboxOptions, SandboxResult, run_python

Mode = Literal["all", "fraction"]
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)

# Runs in the sandbox as the program. Everything it needs (program, tests, nonce) arrives on stdin,
# so reading its own source file teaches the program nothing.
_ASSERT_HARNESS = r"""
def _harness():
    import json, os, sys, traceback
    run, comp, write = exec, compile, os.write  # the program may replace builtins; these are ours
    cfg = json.loads(sys.stdin.read())  # stdin is a pipe: once read, the program can't re-read it
    sys.stdin.close()
    nonce, program, tests = cfg["nonce"], cfg["program"], cfg["tests"]
    del cfg
    report = os.dup(1)  # kept aside: the program may close or redirect stdout
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # and its prints can't push the report past the cap
    ns = {"__name__": "__main__"}
    try:
        run(comp(program, "solution.py", "exec"), ns)
        ran = True
    except SystemExit as e:
        ran = e.code in (None, 0)
    except BaseException:
        traceback.print_exc()
        ran = False
    passed = []
    for i, test in enumerate(tests):
        try:
            if not ran:
                raise RuntimeError("program failed")
            run(comp(test, f"<test {i}>", "exec"), ns)
            passed.append("1")
        except BaseException:
            passed.append("0")
    write(report, (nonce + " " + "".join(passed) + "\n").encode())


_harness()
"""


def extract_code(response: str) -> str | None:
    """The last ```python block; failing that, the last untagged ``` block; else None (other
    languages are never run: an example output or a shell line after the program is not the program)."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    tagged = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    bare = [body for lang, body in blocks if lang == ""]
    return (tagged or bare or [None])[-1]


def normalize_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def run_tests(
    program: str,
    tests: Sequence[dict[str, Any]],
    *,
    timeout_s: float = 5,
    memory_mb: int = 512,
    isolation: Isolation = "auto",
    python: str | None = None,
    stop_at_first_failure: bool = False,
    total_timeout_s: float | None = None,
) -> list[bool]:
    """Pass/fail of every test, in order; tests left when the run-time budget is spent (see the module
    docstring) fail. Raises ValueError for a malformed test (names its index)."""
    asserts = [(i, _check_test(i, t)) for i, t in enumerate(tests)]
    clock = _Budget(own_time_budget(total_timeout_s))
    results: dict[int, bool] = {}
    assert_tests = [(i, src) for i, (kind, src) in asserts if kind == "assert"]
    if assert_tests and (limit := clock.timeout(timeout_s)) is not None:
        srcs = [src for _, src in assert_tests]
        passed, spent = _run_asserts(program, srcs, limit, memory_mb, isolation, python)
        clock.spend(spent)
        results.update({i: ok for (i, _), ok in zip(assert_tests, passed, strict=True)})
        if stop_at_first_failure and not all(passed):
            return [results.get(i, False) for i in range(len(tests))]
    for i, test in enumerate(tests):
        if "assert" in test:
            continue
        if (limit := clock.timeout(timeout_s)) is None:
            break
        expected = str(test["output"])
        room = SandboxOptions(python=python, max_output_bytes=max(64 * 1024, 2 * len(expected) + 1024))
        result = run_python(program, str(test["input"]), limit, memory_mb, limits=room, isolation=isolation)
        clock.spend(result.duration_s)
        results[i] = _io_passed(result, expected)
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
    python: str | None = None,
    total_timeout_s: float | None = None,
) -> float:
    """1.0 when the response's last code block passes every test (or the passing share, `fraction`).
    `total_timeout_s`: the tests' shared run-time budget (default: none outside a scorer call)."""
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
        python=python,
        stop_at_first_failure=mode == "all",
        total_timeout_s=total_timeout_s,
    )
    return float(all(passed)) if mode == "all" else sum(passed) / len(tests)


@register_reward("code")
def code(
    tests_field: str = "tests",
    mode: Mode = "all",
    timeout_s: float = 5,
    memory_mb: int = 512,
    isolation: Isolation = "auto",
    python: str | None = None,
    total_timeout_s: float | None = None,
) -> Any:
    """`reward.fn: code`: tests come from `sample.meta[tests_field]` (a list, or a JSON string of one).
    `total_timeout_s` caps the tests' shared run-time budget below what the component's timeout allows.
    Settings are checked here, once, so a bad one fails the run at setup rather than every rollout."""
    if mode not in ("all", "fraction"):
        raise ValueError(f"code reward mode must be 'all' or 'fraction', got {mode!r}")
    if timeout_s <= 0 or memory_mb < 32:
        raise ValueError(f"code reward needs timeout_s > 0 and memory_mb ≥ 32, got {timeout_s}, {memory_mb}")
    if total_timeout_s is not None and total_timeout_s <= 0:
        raise ValueError(f"code reward needs total_timeout_s > 0 (or null), got {total_timeout_s}")
    probe = run_python("print(6 * 7)", limits=SandboxOptions(python=python), isolation=isolation)
    if probe.stdout != "42\n":
        raise RuntimeError(f"the code sandbox cannot run a trivial program here: {probe.stderr[-300:]}")

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
            python=python,
            total_timeout_s=total_timeout_s,
        )

    return reward


class _Budget:
    """Program run time left to one call's tests (None: unlimited)."""

    def __init__(self, total_s: float | None) -> None:
        self.left = total_s

    def timeout(self, per_test_s: float) -> float | None:
        """The next run's timeout, or None when the budget cannot cover a run: the sandbox grants a run
        `KILL_MARGIN_S` past its timeout before the kill, which the budget must cover too."""
        if self.left is None:
            return per_test_s
        limit = min(per_test_s, self.left - KILL_MARGIN_S)
        return limit if limit > 0 else None

    def spend(self, seconds: float) -> None:
        if self.left is not None:
            self.left -= seconds


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
    program: str, tests: list[str], timeout_s: float, memory_mb: int, isolation: Isolation, python: str | None
) -> tuple[list[bool], float]:
    """Pass/fail of each assert test, and the seconds the harness ran."""
    nonce = secrets.token_hex(16)
    payload = json.dumps({"program": program, "tests": tests, "nonce": nonce})
    options = SandboxOptions(python=python)
    result = run_python(_ASSERT_HARNESS, payload, timeout_s, memory_mb, limits=options, isolation=isolation)
    reports = [line for line in result.stdout.splitlines() if line.startswith(nonce + " ")]
    failed = [False] * len(tests)
    if result.timed_out or not reports:
        return failed, result.duration_s
    bits = reports[-1].split(" ", 1)[1]
    return ([bit == "1" for bit in bits] if len(bits) == len(tests) else failed), result.duration_s
