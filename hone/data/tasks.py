"""Built-in generated tasks with verifiable answers (arithmetic, countdown) and a registry of tasks.

Why generated tasks: they need no download, come in unlimited supply, and are small enough for the tiny
character-level model, so the whole RL loop can be tested end to end offline. Train and eval problems
are split by a hash of the problem itself (not by seed or position), so an eval problem is never
trained on, whatever `n` and `seed` the two calls use.
"""

from __future__ import annotations

import ast
import hashlib
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any, ClassVar, TypeVar

from hone.registry import Registry
from hone.types import Sample
from hone.verifiers.math import math_reward

TASKS: Registry[type[Task]] = Registry("task")
T = TypeVar("T", bound="type[Task]")


def register_task(name: str) -> Callable[[T], T]:
    """Class decorator: make a `Task` subclass constructible as `TASKS[name](**options)`."""

    def add(cls: T) -> T:
        TASKS.add(name, cls)  # a second task under one name is a `ValueError`
        cls.name = name
        return cls

    return add


def get_task(name: str, **options: Any) -> Task:
    """The task registered as `name`, built with `options`; an unknown name is a one-line `KeyError`
    naming the registered ones."""
    return TASKS[name](**options)


def first_line(text: str) -> str:
    """The response up to the first newline or literal eos marker, stripped: what the tasks grade."""
    return text.split("\n", 1)[0].split("<eos>", 1)[0].strip()


class Task(ABC):
    """A problem generator with a verifier. Subclasses implement `_make` (or `_draw`), `reward` and
    `demonstration`."""

    name: ClassVar[str]
    eval_fraction: ClassVar[float] = 0.1  # share of the problem space reserved for evaluation
    # Draws per requested problem before giving up: only hit when the eval share of a small problem
    # space has fewer distinct problems than asked for.
    _max_draws_per_sample: ClassVar[int] = 1000
    # Defaults for built-in rewards a recipe scores this task with, by reward name; the recipe's own
    # `reward.args` win. A task knows what its answers must look like (e.g. computed, not left undone).
    reward_args: ClassVar[dict[str, dict[str, Any]]] = {}

    def _make(self, rng: random.Random) -> Sample:
        """One random problem; its `id` is overwritten by the caller. A task that draws its problems
        another way (reasoning-gym's, by seed and index) overrides `_draw` instead."""
        raise NotImplementedError(f"task {self.name!r} implements neither _make nor _draw")

    @abstractmethod
    def reward(self, response_text: str, sample: Sample) -> float:
        """1.0 for a correct response to `sample`, else 0.0."""

    @abstractmethod
    def demonstration(self, sample: Sample) -> str:
        """A correct response, for SFT warm-up."""

    def _split_key(self, sample: Sample) -> str:
        """What identifies a problem for the train/eval split; override to merge equivalent problems."""
        return sample.prompt or ""

    def is_eval(self, sample: Sample) -> bool:
        digest = hashlib.sha256(f"{self.name}\0{self._split_key(sample)}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.eval_fraction

    def train_samples(self, n: int, seed: int = 0) -> list[Sample]:
        """`n` training problems (repeats allowed: small problem spaces are sampled with replacement)."""
        return self._draw(n, seed, eval_split=False)

    def eval_samples(self, n: int, seed: int = 0, *, at_most: bool = False) -> list[Sample]:
        """`n` distinct evaluation problems, disjoint from every `train_samples` result. A small problem
        space may have fewer: an error, or with `at_most` the ones found (a longer draw starts with a
        shorter one either way)."""
        return self._draw(n, seed, eval_split=True, at_most=at_most)

    def _draw(self, n: int, seed: int, eval_split: bool, at_most: bool = False) -> list[Sample]:
        split = "eval" if eval_split else "train"
        rng = random.Random(f"{self.name}/{split}/{seed}")
        samples: list[Sample] = []
        seen: set[str] = set()
        for _ in range(n * self._max_draws_per_sample):
            if len(samples) == n:
                break
            sample = self._make(rng)
            key = self._split_key(sample)
            if self.is_eval(sample) != eval_split or (eval_split and key in seen):
                continue
            seen.add(key)
            sample.id = f"{self.name}-{split}-{seed}-{len(samples)}"
            samples.append(sample)
        if len(samples) < n and not at_most:
            raise ValueError(
                f"task {self.name!r}: found only {len(samples)} distinct {split} problems of {n}"
            )
        return samples


@register_task("arithmetic")
class Arithmetic(Task):
    """`a<op>b=` with the answer written straight after `=`, e.g. prompt "123+45=", answer "168".

    Operands have `min_digits..max_digits` digits; for `-` the larger operand comes first, so answers
    are never negative. With `pad=True` operands and answers are zero-padded to fixed widths
    ("045+367=" → "0412"): digits of equal place value then sit at fixed offsets, which a small
    transformer learns about 4x faster (its SFT accuracy jumps after ~350 steps instead of ~1500); any
    all-digit response with the right value scores, padded or not. Scored with `reward.fn: math`,
    arithmetic left undone (`400+12`) is refused: computing is the point.
    """

    reward_args: ClassVar[dict[str, dict[str, Any]]] = {"math": {"require_evaluated": True}}

    def __init__(self, min_digits: int = 2, max_digits: int = 3, ops: str = "+", pad: bool = False) -> None:
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        if not ops or set(ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty string of '+', '-', '*', got {ops!r}")
        self.min_digits, self.max_digits, self.ops, self.pad = min_digits, max_digits, ops, pad

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    def _make(self, rng: random.Random) -> Sample:
        a, b, op = self._operand(rng), self._operand(rng), rng.choice(self.ops)
        if op == "-" and a < b:
            a, b = b, a
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        meta = {"a": a, "b": b, "op": op}
        if not self.pad:
            return Sample(id="", prompt=f"{a}{op}{b}=", answer=str(value), meta=meta)
        width = self.max_digits
        answer_width = {"+": width + 1, "-": width, "*": 2 * width}[op]
        return Sample(
            id="", prompt=f"{a:0{width}d}{op}{b:0{width}d}=", answer=f"{value:0{answer_width}d}", meta=meta
        )

    def _split_key(self, sample: Sample) -> str:
        return _calculation_key(sample.meta)

    def reward(self, response_text: str, sample: Sample) -> float:
        response = first_line(response_text)
        if self.pad and response.isascii() and response.isdigit():
            return float(int(response) == int(sample.answer or "-1"))
        return float(response == sample.answer)

    def demonstration(self, sample: Sample) -> str:
        return sample.answer or ""


def _calculation_key(meta: dict[str, Any]) -> str:
    """`a<op>b` with commuting operands sorted: a+b and b+a are the same problem."""
    a, b, op = meta["a"], meta["b"], meta["op"]
    if op in "+*":
        a, b = sorted((a, b))
    return f"{a}{op}{b}"


_OPS: dict[type[ast.operator], tuple[str, int, Callable[[Fraction, Fraction], Fraction]]] = {
    ast.Add: ("+", 1, lambda x, y: x + y),
    ast.Sub: ("-", 1, lambda x, y: x - y),
    ast.Mult: ("*", 2, lambda x, y: x * y),
    ast.Div: ("/", 2, lambda x, y: x / y),
}
_SYMBOLS = {symbol: (node, precedence) for node, (symbol, precedence, _) in _OPS.items()}


@register_task("countdown")
class Countdown(Task):
    """Reach a target with `+ - * /` over given numbers, each used at most once (TinyZero's task).

    Prompt format: the numbers separated by spaces, `>`, the target, `:`; e.g. "19 36 55 7>72:". The
    response is a bare expression such as "55-19+36" (first line graded; no `=`). Targets are built
    from a random expression over all the numbers with integer intermediate results, so every problem
    is solvable; `meta` holds `numbers`, `target` and that `solution`.
    """

    _max_response_chars: ClassVar[int] = 200  # bounds parser work on degenerate responses

    def __init__(
        self, min_numbers: int = 3, max_numbers: int = 4, max_number: int = 99, max_target: int = 999
    ) -> None:
        if not 2 <= min_numbers <= max_numbers:
            raise ValueError(f"need 2 <= min_numbers <= max_numbers, got {min_numbers}, {max_numbers}")
        if max_number < 1 or max_target < 1:
            raise ValueError(f"max_number and max_target must be >= 1, got {max_number}, {max_target}")
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.max_number, self.max_target = max_number, max_target

    def _make(self, rng: random.Random) -> Sample:
        count = rng.randint(self.min_numbers, self.max_numbers)  # drawn once: retries must not skew it
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(count)]
            built = _random_expression(numbers, rng)
            if built is not None and 1 <= built[0] <= self.max_target:
                break
        target, solution, _ = built
        return Sample(
            id="",
            prompt=f"{' '.join(map(str, numbers))}>{target}:",
            answer=str(target),
            meta={"numbers": numbers, "target": target, "solution": solution},
        )

    def _split_key(self, sample: Sample) -> str:
        return f"{sorted(sample.meta['numbers'])}>{sample.meta['target']}"  # number order is irrelevant

    def reward(self, response_text: str, sample: Sample) -> float:
        expression = first_line(response_text)
        if len(expression) > self._max_response_chars:
            return 0.0
        try:
            tree = ast.parse(expression, mode="eval")
            value = _evaluate(tree.body, expression, Counter(sample.meta["numbers"]))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            return 0.0
        return float(value == sample.meta["target"])

    def demonstration(self, sample: Sample) -> str:
        return str(sample.meta["solution"])


def _random_expression(numbers: list[int], rng: random.Random) -> tuple[int, str, int] | None:
    """Combine all numbers in a random order and tree with integer-valued steps.

    Returns (value, text with minimal parentheses, precedence of the top operator), or None when a
    random step was invalid (non-integer division or a negative difference).
    """
    items: list[tuple[int, str, int]] = [(n, str(n), 3) for n in numbers]
    rng.shuffle(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (x, x_text, x_prec), (y, y_text, y_prec) = items[i], items[j]
        symbol = rng.choice(list(_SYMBOLS))
        node, prec = _SYMBOLS[symbol]
        if (symbol == "/" and (y == 0 or x % y)) or (symbol == "-" and x < y):
            return None
        value = int(_OPS[node][2](Fraction(x), Fraction(y)))
        left = x_text if x_prec >= prec else f"({x_text})"
        # The right operand of - and / also needs parentheses at equal precedence: a-(b-c) != a-b-c.
        right = y_text if y_prec > prec or (y_prec == prec and symbol in "+*") else f"({y_text})"
        rest = [item for k, item in enumerate(items) if k not in (i, j)]
        items = [*rest, (value, left + symbol + right, prec)]
    return items[0]


def _evaluate(node: ast.expr, source: str, available: Counter[int]) -> Fraction:
    """Exact value of an expression of the allowed numbers (consumed from `available`) and + - * /."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left = _evaluate(node.left, source, available)
        return _OPS[type(node.op)][2](left, _evaluate(node.right, source, available))
    if isinstance(node, ast.Constant) and type(node.value) is int:
        # Only plain decimals: "0x13" or "1_9" would otherwise pass as 19.
        if ast.get_source_segment(source, node) != str(node.value) or available[node.value] < 1:
            raise ValueError(f"number {node.value} not available")
        available[node.value] -= 1
        return Fraction(node.value)
    raise ValueError(f"disallowed syntax: {type(node).__name__}")


# Two-operand story templates per operation: {name} {pronoun} {item} {a} {b}. A handful of each is
# enough for the numbers (not the wording) to carry the difficulty, and for a small pretrained model to
# recognise the operation.
_STORIES: dict[str, tuple[str, ...]] = {
    "+": (
        "{name} has {a} {item}. {pronoun} gets {b} more. How many {item} does {name} have now?",
        "There are {a} {item} in one box and {b} {item} in another. How many {item} are there in total?",
        "{name} collected {a} {item} on Monday and {b} {item} on Tuesday. How many {item} did {name} "
        "collect in all?",
    ),
    "-": (
        "{name} had {a} {item} and gave away {b} of them. How many {item} does {name} have left?",
        "A shop had {a} {item}. It sold {b} of them. How many {item} does the shop have left?",
        "{name} needs {a} {item} and already has {b}. How many more {item} does {name} need?",
    ),
    "*": (
        "{name} buys {a} bags with {b} {item} in each bag. How many {item} does {name} buy?",
        "There are {a} rows with {b} {item} in each row. How many {item} are there?",
        "{name} reads {b} {item} a day for {a} days. How many {item} does {name} read?",
    ),
}
_NAMES = (("Ana", "She"), ("Ben", "He"), ("Chloe", "She"), ("Dev", "He"), ("Emma", "She"), ("Omar", "He"))
_ITEMS = ("apples", "marbles", "stickers", "pages", "coins", "pencils", "cookies", "stamps")
_OP_WORDS = {"+": "+", "-": "-", "*": "\\times"}


@register_task("word_problems")
class WordProblems(Task):
    """One-step arithmetic word problems for pretrained chat models, answered in `\\boxed{}`.

    `a ± b` with operands in 2..`max_addend` (the larger first for `-`) and `a × b` with `a` in
    2..`max_factor` and `b` in 2..`max_multiplicand` — the ranges of the peer run recorded in issue 6.
    Graded by `math_reward` (last `\\boxed{}`, else the final number) with arithmetic left undone
    refused, here and under `reward.fn: math`: a policy must compute `67 - 37`, not leave it to the
    verifier. The train/eval split is by the arithmetic (`op` and operands), not the wording, so no
    held-out calculation is ever trained on.
    """

    instruction: ClassVar[str] = "Put the final answer in \\boxed{}."
    reward_args: ClassVar[dict[str, dict[str, Any]]] = {"math": {"require_evaluated": True}}

    def __init__(
        self, ops: str = "+-*", max_addend: int = 99, max_factor: int = 12, max_multiplicand: int = 25
    ) -> None:
        if not ops or set(ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty string of '+', '-', '*', got {ops!r}")
        if min(max_addend, max_factor, max_multiplicand) < 2:
            raise ValueError("max_addend, max_factor and max_multiplicand must be >= 2")
        self.ops, self.max_addend = ops, max_addend
        self.max_factor, self.max_multiplicand = max_factor, max_multiplicand

    def _make(self, rng: random.Random) -> Sample:
        op = rng.choice(self.ops)
        if op == "*":
            a, b = rng.randint(2, self.max_factor), rng.randint(2, self.max_multiplicand)
        else:
            a, b = rng.randint(2, self.max_addend), rng.randint(2, self.max_addend)
            if op == "-" and a < b:
                a, b = b, a
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        name, pronoun = rng.choice(_NAMES)
        story = rng.choice(_STORIES[op]).format(name=name, pronoun=pronoun, item=rng.choice(_ITEMS), a=a, b=b)
        return Sample(
            id="", prompt=f"{story} {self.instruction}", answer=str(value), meta={"a": a, "b": b, "op": op}
        )

    def _split_key(self, sample: Sample) -> str:
        return _calculation_key(sample.meta)

    def reward(self, response_text: str, sample: Sample) -> float:
        return math_reward(response_text, sample.answer or "", **self.reward_args["math"])

    def demonstration(self, sample: Sample) -> str:
        a, b, op = sample.meta["a"], sample.meta["b"], sample.meta["op"]
        return f"${a} {_OP_WORDS[op]} {b} = {sample.answer}$. The answer is $\\boxed{{{sample.answer}}}$."
