"""Built-in tasks: train/eval disjointness, generator invariants, and verifier strictness."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.data import TASKS, Arithmetic, Countdown, Task, WordProblems, get_task, register_task
from hone.types import Sample


def test_registry_builds_configured_tasks_and_rejects_unknown_names() -> None:
    task = TASKS["arithmetic"](min_digits=1, max_digits=1, ops="*")
    assert isinstance(task, Arithmetic) and task.name == "arithmetic"
    assert all(s.prompt[1] == "*" and len(s.prompt) == 4 for s in task.train_samples(20, seed=0))
    assert isinstance(get_task("countdown", max_numbers=3), Countdown)
    with pytest.raises(
        KeyError, match=r"unknown task 'nope'; registered: arithmetic, countdown, .*word_problems"
    ):
        get_task("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_task("arithmetic")(Arithmetic)
    with pytest.raises(ValueError, match="ops"):
        Arithmetic(ops="/")
    with pytest.raises(ValueError, match="min_digits"):
        Arithmetic(min_digits=3, max_digits=2)
    with pytest.raises(ValueError, match="min_numbers"):
        Countdown(min_numbers=1)


@pytest.mark.parametrize(
    "task",
    [Arithmetic(), Arithmetic(min_digits=1, max_digits=1, ops="+-*"), Countdown(), WordProblems()],
    ids=["sums", "one-digit-mixed", "countdown", "word-problems"],
)
def test_train_and_eval_never_share_a_problem_whatever_n_and_seed(task: Task) -> None:
    train_keys = {task._split_key(s) for seed in range(3) for s in task.train_samples(300, seed)}
    eval_samples = [s for seed in range(3) for s in task.eval_samples(10, seed)]
    assert train_keys.isdisjoint({task._split_key(s) for s in eval_samples})
    assert not any(task.is_eval(s) for s in task.train_samples(50, seed=9))


def test_samples_are_reproducible_with_unique_ids_and_distinct_eval_problems() -> None:
    task = Countdown()
    assert task.train_samples(30, seed=4) == task.train_samples(30, seed=4)
    assert task.train_samples(30, seed=4) != task.train_samples(30, seed=5)
    samples = task.train_samples(30, seed=4) + task.eval_samples(30, seed=4)
    assert len({s.id for s in samples}) == 60
    assert len({s.prompt for s in task.eval_samples(30, seed=4)}) == 30


def test_eval_request_larger_than_the_eval_problem_space_fails_clearly() -> None:
    task = Arithmetic(min_digits=1, max_digits=1)  # 55 distinct sums, about 10% of them held out
    with pytest.raises(ValueError, match=r"found only \d+ distinct eval problems of 40"):
        task.eval_samples(40)


def test_arithmetic_samples_and_strict_reward() -> None:
    task = Arithmetic(min_digits=2, max_digits=3, ops="+-")
    for s in task.train_samples(200, seed=1):
        a, b, op = s.meta["a"], s.meta["b"], s.meta["op"]
        assert s.prompt == f"{a}{op}{b}=" and 10 <= a <= 999 and 10 <= b <= 999
        assert int(s.answer) == (a + b if op == "+" else a - b) >= 0
        assert task.reward(task.demonstration(s), s) == 1.0
    s = Sample(id="x", prompt="123+45=", answer="168")
    assert [task.reward(r, s) for r in ["168", " 168 \nmore", "168<eos>", "1680", "16", "168.0", ""]] == [
        1.0,
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]


def test_countdown_prompt_format_and_generated_solutions_are_valid() -> None:
    task = Countdown()
    for s in task.train_samples(300, seed=2) + task.eval_samples(50, seed=2):
        numbers, target = s.meta["numbers"], s.meta["target"]
        assert s.prompt == " ".join(map(str, numbers)) + f">{target}:"
        assert 3 <= len(numbers) <= 4 and all(1 <= n <= 99 for n in numbers) and 1 <= target <= 999
        assert task.reward(task.demonstration(s), s) == 1.0
    counts = [len(s.meta["numbers"]) for s in task.train_samples(400, seed=3)]
    assert 0.35 < counts.count(4) / len(counts) < 0.65  # retries do not skew toward 3 numbers


COUNTDOWN = Sample(id="c", prompt="4 6 10>5:", answer="5", meta={"numbers": [4, 6, 10], "target": 5})


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("10/(6-4)", 1.0),
        (" (10 / (6 - 4)) \n", 1.0),  # spaces and anything after the first line are ignored
        ("10*4/(6+10)*2", 0.0),  # 10 used twice; 2 not available
        ("10/2", 0.0),  # 2 is not one of the numbers
        ("6-4+10/10", 0.0),
        ("10/(4-4)", 0.0),  # division by zero (and 4 reused)
        ("6/(10-10)", 0.0),
        ("10/(6-4)=5", 0.0),
        ("-(4-6)+0x3", 0.0),  # unary minus and hex are not plain expressions
        ("0x0a/(6-4)", 0.0),
        ("10.0/(6-4)", 0.0),
        ("__import__('os')", 0.0),
        ("(" * 500 + "4" + ")" * 500, 0.0),
        ("4+6", 0.0),  # valid expression, wrong value
        ("", 0.0),
    ],
)
def test_countdown_reward_is_exact_and_accepts_only_plain_arithmetic(response: str, reward: float) -> None:
    assert Countdown().reward(response, COUNTDOWN) == reward


def test_countdown_uses_exact_rationals() -> None:
    sample = Sample(id="c", prompt="", answer="1", meta={"numbers": [1, 3, 3], "target": 1})
    assert Countdown().reward("(1/3)*3", sample) == 1.0  # float arithmetic would give 0.999...
    sample = Sample(id="c", prompt="", answer="", meta={"numbers": [1, 2, 3, 4], "target": 6})
    assert Countdown().reward("1/2/3*4*9", sample) == 0.0
    assert Countdown().reward("2*3", sample) == 1.0  # numbers may be left unused


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), numbers=st.integers(2, 5), max_number=st.integers(1, 30))
def test_countdown_generator_is_always_solvable(seed: int, numbers: int, max_number: int) -> None:
    task = Countdown(min_numbers=numbers, max_numbers=numbers, max_number=max_number)
    sample = task._make(random.Random(seed))
    assert len(sample.meta["numbers"]) == numbers
    assert task.reward(task.demonstration(sample), sample) == 1.0
    assert Fraction(sample.meta["target"]).denominator == 1


def test_padded_arithmetic_has_fixed_widths_and_accepts_the_value_either_way() -> None:
    from hone.data import get_task

    task = get_task("arithmetic", min_digits=2, max_digits=3, pad=True)
    samples = task.train_samples(50, seed=1)
    assert all(len(s.prompt) == 8 and len(s.answer) == 4 for s in samples)  # "045+367=" → "0412"
    s = next(x for x in samples if x.answer.startswith("0"))
    assert task.reward(s.answer, s) == 1.0
    assert task.reward(s.answer.lstrip("0"), s) == 1.0
    assert task.reward(str(int(s.answer) + 1), s) == 0.0
    assert task.reward("12a", s) == 0.0
    plain = get_task("arithmetic", min_digits=2, max_digits=3)
    same_problems = [(x.meta["a"], x.meta["b"]) for x in plain.eval_samples(20)]
    assert same_problems == [(x.meta["a"], x.meta["b"]) for x in task.eval_samples(20)]  # same split


def test_word_problems_state_the_numbers_and_grade_boxed_or_final_answers() -> None:
    task = get_task("word_problems", max_addend=20)
    samples = task.train_samples(200, seed=1)
    assert {s.meta["op"] for s in samples} == {"+", "-", "*"}
    for s in samples:
        a, b, op = s.meta["a"], s.meta["b"], s.meta["op"]
        assert str(a) in s.prompt and str(b) in s.prompt
        assert s.prompt.endswith("Put the final answer in \\boxed{}.")
        assert int(s.answer) == {"+": a + b, "-": a - b, "*": a * b}[op] >= 0
        assert task.reward(task.demonstration(s), s) == 1.0
    sample = next(s for s in samples if s.meta["op"] == "*")
    right, wrong = sample.answer, str(int(sample.answer) + 1)
    assert task.reward(f"so it is \\boxed{{{right}}}", sample) == 1.0
    assert task.reward(f"{wrong} apples, I mean {right}", sample) == 1.0  # no box: the final number
    assert task.reward(f"\\boxed{{{wrong}}} and not {right}", sample) == 0.0  # the box wins
    a, b = sample.meta["a"], sample.meta["b"]
    assert task.reward(f"\\boxed{{{a} \\times {b}}}", sample) == 0.0  # computing is the point
    assert task.reward(f"The answer is {a} \\times {b}, which is {wrong}.", sample) == 0.0  # the final value
    with pytest.raises(ValueError, match="ops"):
        WordProblems(ops="/")
