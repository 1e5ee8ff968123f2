"""Code reward: extraction of the last code block, stdin/stdout and assert tests in the sandbox, and
the reward hacks the assert harness must not reward (early exit, forged reports)."""

from __future__ import annotations

import json
import time

import pytest

from hone.rewards import REWARDS, code_reward, extract_code
from hone.rewards.code import normalize_output, run_tests
from hone.rewards.scoring import RewardComponent, RewardScorer, reward_failed
from hone.types import Rollout, Sample
from tests.conftest import needs_sandbox

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
IO_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4", "output": "6"}]
FN = "```python\ndef add(a, b):\n    return a + b\n```"
ASSERTS = [{"assert": "assert add(1, 2) == 3"}, {"assert": "assert add(-1, 1) == 0"}]


def respond(body: str, lang: str = "python") -> str:
    return f"Here is my solution.\n```{lang}\n{body}\n```\nDone."


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```\nprint(2)\n```", "print(2)\n"),
        ("first\n```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```", "print(2)\n"),
        ("```python\nprint(1)\n```\n```bash\nls\n```", "print(1)\n"),  # a shell snippet is not the program
        ("```python\nprint(6)\n```\nExample output:\n```\n6\n```", "print(6)\n"),  # tagged beats bare
        ("no code here, just print(1)", None),
        ("```python\nprint(1)", None),  # unterminated: truncated response, nothing to run
    ],
)
def test_extract_code_takes_the_last_python_block(response: str, expected: str | None) -> None:
    assert extract_code(response) == expected


@needs_sandbox
def test_stdin_stdout_tests_pass_and_fail() -> None:
    assert code_reward(ADD, IO_TESTS) == 1.0
    wrong = ADD.replace("a + b", "a - b")
    assert code_reward(wrong, IO_TESTS) == 0.0
    half = ADD.replace("print(a + b)", "print(3)")
    assert code_reward(half, IO_TESTS, mode="fraction") == 0.5
    assert code_reward(half, IO_TESTS, mode="all") == 0.0


@needs_sandbox
def test_output_comparison_ignores_trailing_whitespace_only() -> None:
    assert normalize_output("1 2  \n3\t\n\n\n") == "1 2\n3"
    assert (
        code_reward(respond("print('1 2  ')\nprint(3)\nprint()"), [{"input": "", "output": "1 2\n3"}]) == 1.0
    )
    assert code_reward(respond("print(' 3')"), [{"input": "", "output": "3"}]) == 0.0  # leading space counts


@needs_sandbox
def test_a_correct_program_with_a_long_output_passes() -> None:
    expected = "\n".join(map(str, range(20_000)))  # ~109 KB, above the sandbox's default output cap
    assert (
        code_reward(respond("for i in range(20_000):\n    print(i)"), [{"input": "", "output": expected}])
        == 1.0
    )


@needs_sandbox
def test_a_crash_or_timeout_fails_the_test_even_with_the_right_output() -> None:
    crash = respond("print(3)\nraise SystemExit(1)")
    assert code_reward(crash, [{"input": "", "output": "3"}]) == 0.0
    slow = respond("print(3, flush=True)\nwhile True: pass")
    assert code_reward(slow, [{"input": "", "output": "3"}], timeout_s=0.5) == 0.0


@needs_sandbox
def test_assert_tests_run_after_the_program_in_its_namespace() -> None:
    assert code_reward(FN, ASSERTS) == 1.0
    assert code_reward(FN.replace("a + b", "a * b"), ASSERTS, mode="fraction") == 0.0
    assert code_reward(FN.replace("a + b", "abs(a) + b"), ASSERTS, mode="fraction") == 0.5
    assert run_tests("def add(a, b):\n    return a + b\n", [*ASSERTS, {"input": "", "output": ""}]) == [
        True,
        True,
        True,
    ]


@needs_sandbox
@pytest.mark.parametrize(
    "hack",
    [
        "import os\nos._exit(0)",  # exit before the tests run
        "import sys\nsys.exit(1)",
        "raise KeyboardInterrupt",
        "print('ok 11')\nimport os\nos._exit(0)",  # a forged report without the nonce
        "import builtins\nbuiltins.exec = lambda *a, **k: None",  # disable the tests' exec
        "import __main__\n__main__._cfg = None",  # tamper with the harness's module state
        "import sys, os\nsys.stdin.seek(0)\nnonce = sys.stdin.read()[-40:]\nos.write(1, nonce.encode())",
        "import sys, os\nsys.stdout.close()\nos.close(1)",
    ],
)
def test_assert_harness_gives_nothing_for_reward_hacks(hack: str) -> None:
    assert code_reward(respond("def add(a, b):\n    return 7\n" + hack), ASSERTS, mode="fraction") == 0.0


@needs_sandbox
def test_a_program_calling_sys_exit_0_still_faces_its_tests() -> None:
    program = "def add(a, b):\n    return a + b\nimport sys\nsys.exit(0)"
    assert code_reward(respond(program), ASSERTS) == 1.0
    assert code_reward(respond(program.replace("a + b", "a - b")), ASSERTS) == 0.0


def test_no_code_block_scores_zero_without_running_anything() -> None:
    assert code_reward("print(3)", [{"input": "", "output": "3"}]) == 0.0


def test_malformed_tests_are_rejected_with_their_index() -> None:
    with pytest.raises(ValueError, match="test 1: expected"):
        code_reward(ADD, [IO_TESTS[0], {"stdin": "1"}])
    with pytest.raises(ValueError, match="at least one test"):
        code_reward(ADD, [])


@needs_sandbox
def test_registered_code_reward_reads_tests_from_sample_meta() -> None:
    reward = REWARDS["code"](mode="fraction")
    rollout = Rollout("s", 0, [1, 2], 1, [1], [0.0], response_text=ADD)
    assert reward(rollout, Sample("s", prompt="add", meta={"tests": IO_TESTS})) == 1.0
    assert reward(rollout, Sample("s", prompt="add", meta={"tests": json.dumps(IO_TESTS)})) == 1.0
    with pytest.raises(ValueError, match=r"sample 'q'.*non-empty list"):
        reward(rollout, Sample("q", prompt="add"))
    with pytest.raises(ValueError, match="mode must be"):
        REWARDS["code"](mode="most")


# Passes the "ok" test, hangs on every other input.
HANGS_BUT_ONE = respond("import time\nif input() != 'ok':\n    time.sleep(60)\nprint('ok')")
HANGING_TESTS = [{"input": "ok", "output": "ok"}] + [{"input": "x", "output": "x"}] * 7


@needs_sandbox
def test_hanging_tests_are_graded_within_the_component_timeout_not_timed_out() -> None:
    """Seven tests hanging for their own timeout (1 s, +0.5 s before the kill) overrun the call's 4 s: a
    timed-out call would be left out of training. The tests share a budget under the call's timeout
    instead, and those left when it is spent fail: the passing share is 1/8."""
    reward = REWARDS["code"](mode="fraction", timeout_s=1.0)
    scorer = RewardScorer([RewardComponent("code", reward)], timeout_s=4.0)
    slow = Rollout("s", 0, [1, 2], 1, [1], [0.0], response_text=HANGS_BUT_ONE)
    metrics = scorer.score([slow], {"s": Sample("s", prompt="echo", meta={"tests": HANGING_TESTS})})
    assert metrics["reward/timeouts"] == 0.0 and not reward_failed(slow)
    assert slow.reward == pytest.approx(1 / 8)


@needs_sandbox
def test_total_timeout_caps_the_tests_run_time_outside_a_scorer() -> None:
    start = time.monotonic()
    score = code_reward(HANGS_BUT_ONE, HANGING_TESTS, mode="fraction", timeout_s=1.0, total_timeout_s=2.0)
    # 2 s cover one hanging test (1 s + the 0.5 s kill margin) after the passing one, not a second.
    assert score == pytest.approx(1 / 8)
    assert time.monotonic() - start < 5.0


def test_total_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="total_timeout_s > 0"):
        REWARDS["code"](total_timeout_s=0)
