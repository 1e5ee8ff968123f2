"""Built-in self-contained environments: each generates its own samples and a scripted solution.

* `tool_arithmetic` — multiply or add 3–4-digit numbers with a calculator tool, then answer. Small
  models get products like 4521*37 wrong by themselves; one calculator call gets them right, so
  reward rises as the policy learns to call the tool and copy its result.
* `guess_number` — a secret in 1..high, replies "higher"/"lower". The secret is in no prompt, so it
  can only be found by reading the observations; binary search solves it in `high.bit_length()`
  guesses. Messages are a few characters each ("16", "higher") so a byte-level model of ~1M
  parameters can play whole episodes.
* `frozen_lake` — the FrozenLake grid as RAGEN (Wang et al. 2025) uses it for multi-turn RL: reach G
  from S without stepping on a hole H, one move per turn, the board re-rendered as text after each
  move. Departures from RAGEN/Gymnasium: never slippery (so a scripted BFS path always solves it and
  rewards are deterministic); S and G are placed at random rather than in opposite corners, so the
  policy must read the board instead of memorising "down, right"; the player is drawn as `P`;
  one action per turn.

Samples come from `make_samples(n, seed, split, **args)` (args: the constructor's). Train and eval
splits are disjoint by a hash of the problem itself, as in `hone.data.tasks`; unlike there, both
splits sample with replacement, since `guess_number`'s whole problem space is 32 secrets.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import deque
from collections.abc import Callable
from typing import Any

from hone.envs.base import Environment, Message, StepResult, register_env
from hone.envs.tool_env import ToolEnv
from hone.envs.tools import calculator, calculator_tool
from hone.types import Sample
from hone.verifiers.math import math_reward


def _is_eval(name: str, key: str, eval_fraction: float) -> bool:
    digest = hashlib.sha256(f"{name}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def _draw(
    name: str,
    n: int,
    seed: int,
    split: str,
    make: Callable[[random.Random], tuple[str, Sample]],
    eval_fraction: float = 0.1,
) -> list[Sample]:
    """`n` samples of `split` from `make(rng) -> (split key, sample)`, deterministic in (n, seed)."""
    _split_check(split)
    rng = random.Random(f"{name}/{split}/{seed}")
    samples: list[Sample] = []
    for _ in range(1000 * max(n, 1)):
        if len(samples) == n:
            return samples
        key, sample = make(rng)
        if _is_eval(name, key, eval_fraction) == (split == "eval"):
            sample.id = f"{name}-{split}-{seed}-{len(samples)}"
            samples.append(sample)
    if len(samples) < n:
        raise ValueError(f"environment {name!r}: the {split} split has too few problems for {n} samples")
    return samples


def _split_check(split: str) -> None:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


# --- tool_arithmetic ---


@register_env("tool_arithmetic")
class ToolArithmetic(ToolEnv):
    """ "What is 4521*37? ..." with a calculator tool; reward 1.0 for a final answer equal to the value
    (written out: `4521*37` left for the verifier to evaluate scores 0, or the tool would be optional).
    """

    max_turns = 4

    def __init__(self, max_calls_per_turn: int = 4) -> None:
        super().__init__([calculator_tool()], max_calls_per_turn=max_calls_per_turn)
        self.answer: str | None = None

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, **args: Any) -> list[Sample]:
        def make(rng: random.Random) -> tuple[str, Sample]:
            a, b, op = rng.randint(100, 9999), rng.randint(100, 9999), rng.choice("+*")
            value = a + b if op == "+" else a * b
            meta = {"a": a, "b": b, "op": op}
            sample = Sample(id="", messages=[_user(_question(a, op, b))], answer=str(value), meta=meta)
            return f"{min(a, b)}{op}{max(a, b)}", sample  # a*b and b*a are one problem

        return _draw("tool_arithmetic", n, seed, split, make)

    def reset(self, sample: Sample) -> list[Message]:
        if sample.answer is None:
            raise ValueError(f"tool_arithmetic sample {sample.id!r} has no answer")
        self.answer = sample.answer
        if {"a", "b", "op"} <= sample.meta.keys():
            return [_user(_question(sample.meta["a"], sample.meta["op"], sample.meta["b"]))]
        if sample.messages:  # a dataset's own question
            return [dict(m) for m in sample.messages]
        return [_user(sample.prompt or "")]

    def finish(self, final_message: str) -> StepResult:
        reward = math_reward(final_message, self.answer or "", require_evaluated=True)
        return StepResult([], reward=reward, done=True, info={"solved": reward})

    def demonstration(self, sample: Sample) -> list[Message]:
        expression = f"{sample.meta['a']}{sample.meta['op']}{sample.meta['b']}"
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        return [
            *self.reset(sample),
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "name": "calculator", "content": calculator(expression)},
            {"role": "assistant", "content": sample.answer or ""},
        ]


def _question(a: int, op: str, b: int) -> str:
    return f"What is {a}{op}{b}? Use the calculator tool, then reply with the answer."


def _user(content: str) -> Message:
    return {"role": "user", "content": content}


def _assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


# --- guess_number ---

_INTEGER = re.compile(r"-?\d+")


@register_env("guess_number")
class GuessNumber(Environment):
    """Find a secret in 1..high; each guess is answered "higher" or "lower" (as the user).

    The first integer in a reply is the guess; a reply without one gets "Reply with a number." and still
    uses a turn. Reward 1.0 on the right guess; after `max_turns` (binary search's worst case + `slack`)
    wrong ones the episode ends with 0.

    Both splits play every secret in 1..high, each in its own shuffled cycle (so in an evaluation of a
    multiple of `high` games every secret weighs the same). Unlike a problem set, nothing is held out:
    every game starts from the same prompt and the policy never sees the secret, so holding out secrets
    would hold out *answers* — and RL on the other secrets then learns that those numbers are never
    right (measured: the share of greedy guesses naming a held-out number fell from 0.375 to 0.079 in
    100 GRPO steps while training-secret success rose; README "Agents"). What an evaluation measures
    here is the search strategy, over the secrets' uniform distribution, as in classic RL's evaluation
    on fresh episodes of the same environment.

    `shaping` > 0 adds a per-turn reward for the information a guess earns: `shaping` times the share of
    log2(high) by which the interval of still-possible secrets shrank. A game that finds the secret
    collects exactly `shaping` over its turns (the interval ends at one number), one that does not
    collects less; a repeated or inconsistent guess earns nothing. A solved game scores 1 + shaping, an
    unsolved one at most `shaping` (< 1), so "reward >= 1" still means solved.
    """

    max_turns = 7

    def __init__(
        self, high: int = 32, slack: int = 1, demo_spread: float = 0.0, shaping: float = 0.0
    ) -> None:
        if high < 2:
            raise ValueError(f"high must be >= 2, got {high}")
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack}")
        if not 0.0 <= demo_spread <= 1.0:
            raise ValueError(f"demo_spread must be in [0, 1], got {demo_spread}")
        if not 0.0 <= shaping < 1.0:
            raise ValueError(f"shaping must be in [0, 1), got {shaping}")
        self.high, self.slack, self.demo_spread, self.shaping = high, slack, demo_spread, shaping
        self.max_turns = high.bit_length() + slack
        self.secret = 0
        self.turns = 0
        self.low_seen, self.high_seen = 1, high

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, high: int = 32, **args: Any) -> list[Sample]:
        _split_check(split)
        if high < 2:
            raise ValueError(f"guess_number: high must be >= 2, got {high}")
        secrets = list(range(1, high + 1))  # every secret in both splits: see the class docstring
        rng = random.Random(f"guess_number/{split}/{seed}")
        order: list[int] = []
        while len(order) < n:
            rng.shuffle(secrets)
            order += secrets
        return [
            Sample(
                id=f"guess_number-{split}-{seed}-{i}",
                messages=[_user(_guess_prompt(high))],
                answer=str(secret),
                meta={"secret": secret, "high": high},
            )
            for i, secret in enumerate(order[:n])
        ]

    def reset(self, sample: Sample) -> list[Message]:
        self.high = int(sample.meta.get("high", self.high))
        self.max_turns = self.high.bit_length() + self.slack
        self.secret = int(sample.meta["secret"])
        if not 1 <= self.secret <= self.high:
            raise ValueError(f"guess_number sample {sample.id!r}: secret {self.secret} not in 1..{self.high}")
        self.turns = 0
        self.low_seen, self.high_seen = 1, self.high
        return [_user(_guess_prompt(self.high))]

    def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        out_of_turns = self.turns >= self.max_turns
        match = _INTEGER.search(assistant_message)
        if match is None:
            return StepResult([_user("Reply with a number.")], done=out_of_turns, info={"invalid": 1.0})
        guess = _parse_int(match.group())
        information = self._narrow(guess)
        if guess == self.secret:
            return StepResult([], reward=1.0 + information, done=True, info={"solved": 1.0})
        reply = "higher" if guess < self.secret else "lower"
        return StepResult([_user(reply)], reward=information, done=out_of_turns)

    def _narrow(self, guess: int) -> float:
        """Shrink the interval of still-possible secrets by the guess; the shaping reward it earned."""
        before = self.high_seen - self.low_seen + 1
        if guess == self.secret:
            self.low_seen = self.high_seen = guess
        elif guess < self.secret:
            self.low_seen = max(self.low_seen, guess + 1)
        else:
            self.high_seen = min(self.high_seen, guess - 1)
        after = self.high_seen - self.low_seen + 1
        return self.shaping * math.log2(before / after) / math.log2(self.high)

    def demonstration(self, sample: Sample) -> list[Message]:
        messages = self.reset(sample)
        rng = random.Random(f"guess_number/demo/{sample.id}")
        low, high = 1, self.high
        while True:
            guess = _demo_guess(low, high, self.demo_spread, rng)
            messages.append(_assistant(str(guess)))
            if guess == self.secret:
                return messages
            if guess < self.secret:
                low = guess + 1
                messages.append(_user("higher"))
            else:
                high = guess - 1
                messages.append(_user("lower"))


def _demo_guess(low: int, high: int, spread: float, rng: random.Random) -> int:
    """Bisection's guess, or with `spread` > 0 a uniform pick from the middle `spread` of [low, high]:
    demonstrations then show a guess for many intervals, not only the 2 * high - 1 or so nodes of one
    fixed search tree, so a sampled guess that leaves the tree does not land the model somewhere no
    demonstration ever went."""
    mid = (low + high) // 2
    half = round(spread * (high - low) / 2)
    return rng.randint(max(low, mid - half), min(high, mid + half))


def _guess_prompt(high: int) -> str:
    return f"Guess my number (1-{high})."


def _parse_int(digits: str) -> int:
    # A 5000-digit "guess" must not hit int()'s digit limit (ValueError); it is just very large.
    return int(digits) if len(digits) <= 18 else (-(10**18) if digits.startswith("-") else 10**18)


# --- frozen_lake ---

_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_SHORT = {"u": "up", "d": "down", "l": "left", "r": "right"}
_MOVE_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_LAKE_PROMPT = "Reach G, avoid H. Moves: up down left right. You are P."


@register_env("frozen_lake")
class FrozenLake(Environment):
    """RAGEN-style FrozenLake as text: S start, F frozen, H hole, G goal, P the player.

    A reply's move is its first `up`/`down`/`left`/`right` word, or a reply that is just `u`/`d`/`l`/`r`.
    A move off the board leaves the player in place (as in Gymnasium); a reply with no move gets
    "Invalid move." and the board, and uses a turn. Hole: done, reward 0. Goal: done, reward 1.
    """

    max_turns = 10  # for the default 4x4 board: 3 * size - 2

    def __init__(self, size: int = 4, hole_prob: float = 0.2) -> None:
        if not 2 <= size <= 8:
            raise ValueError(f"size must be in 2..8, got {size}")
        if not 0.0 <= hole_prob < 1.0:
            raise ValueError(f"hole_prob must be in [0, 1), got {hole_prob}")
        self.size, self.hole_prob = size, hole_prob
        self.max_turns = _lake_turns(size)
        self.grid: list[str] = []
        self.pos = (0, 0)
        self.turns = 0

    @classmethod
    def make_samples(
        cls, n: int, seed: int, split: str, size: int = 4, hole_prob: float = 0.2, **args: Any
    ) -> list[Sample]:
        def make(rng: random.Random) -> tuple[str, Sample]:
            while True:
                grid = _random_lake(rng, size, hole_prob)
                path = _shortest_path(grid)
                if path is not None and len(path) <= _lake_turns(size):
                    break
            sample = Sample(
                id="", messages=[_user(_lake_prompt(grid, _find(grid, "S")))], answer=" ".join(path)
            )
            sample.meta = {"grid": grid}
            return "/".join(grid), sample

        return _draw("frozen_lake", n, seed, split, make)

    def reset(self, sample: Sample) -> list[Message]:
        grid = list(sample.meta["grid"])
        _check_lake(grid, sample.id)
        self.grid, self.pos, self.turns = grid, _find(grid, "S"), 0
        self.max_turns = _lake_turns(len(grid))
        return [_user(_lake_prompt(grid, self.pos))]

    def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        out_of_turns = self.turns >= self.max_turns
        move = _parse_move(assistant_message)
        if move is None:
            board = _render(self.grid, self.pos)
            return StepResult([_user("Invalid move.\n" + board)], done=out_of_turns, info={"invalid": 1.0})
        dr, dc = _MOVES[move]
        row, col = self.pos[0] + dr, self.pos[1] + dc
        if 0 <= row < len(self.grid) and 0 <= col < len(self.grid[0]):
            self.pos = (row, col)
        cell = self.grid[self.pos[0]][self.pos[1]]
        if cell == "G":
            return StepResult([], reward=1.0, done=True, info={"solved": 1.0})
        if cell == "H":
            return StepResult([], reward=0.0, done=True, info={"fell": 1.0})
        return StepResult([_user(_render(self.grid, self.pos))], done=out_of_turns)

    def demonstration(self, sample: Sample) -> list[Message]:
        messages = self.reset(sample)
        path = _shortest_path(self.grid)
        if path is None:
            raise ValueError(f"frozen_lake sample {sample.id!r} has no path from S to G")
        pos = self.pos
        for i, move in enumerate(path):
            messages.append(_assistant(move))
            pos = (pos[0] + _MOVES[move][0], pos[1] + _MOVES[move][1])
            if i < len(path) - 1:
                messages.append(_user(_render(self.grid, pos)))
        return messages


def _lake_turns(size: int) -> int:
    # Room for the shortest path of every generated map (make_samples keeps only those that fit).
    return 3 * size - 2


def _random_lake(rng: random.Random, size: int, hole_prob: float) -> list[str]:
    cells = [["H" if rng.random() < hole_prob else "F" for _ in range(size)] for _ in range(size)]
    start, goal = rng.sample(range(size * size), 2)
    cells[start // size][start % size] = "S"
    cells[goal // size][goal % size] = "G"
    return ["".join(row) for row in cells]


def _shortest_path(grid: list[str]) -> list[str] | None:
    """BFS from S to G over non-hole cells: the move names, or None if G is unreachable."""
    start = _find(grid, "S")
    came: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if grid[pos[0]][pos[1]] == "G":
            path = []
            while (step := came[pos]) is not None:
                pos, move = step
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in _MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            inside = 0 <= nxt[0] < len(grid) and 0 <= nxt[1] < len(grid[0])
            if inside and nxt not in came and grid[nxt[0]][nxt[1]] != "H":
                came[nxt] = (pos, move)
                queue.append(nxt)
    return None


def _find(grid: list[str], cell: str) -> tuple[int, int]:
    return next((r, row.index(cell)) for r, row in enumerate(grid) if cell in row)


def _check_lake(grid: list[str], sample_id: str) -> None:
    text = "".join(grid)
    shape_ok = bool(grid) and all(len(row) == len(grid[0]) for row in grid)
    if not shape_ok or set(text) - set("SFHG") or text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(f"frozen_lake sample {sample_id!r}: bad grid {grid} (rows of S F H G, one S, one G)")


def _render(grid: list[str], pos: tuple[int, int]) -> str:
    rows = [list(row) for row in grid]
    rows[pos[0]][pos[1]] = "P"
    return "\n".join("".join(row) for row in rows)


def _lake_prompt(grid: list[str], pos: tuple[int, int]) -> str:
    return f"{_LAKE_PROMPT}\n{_render(grid, pos)}"


def _parse_move(text: str) -> str | None:
    match = _MOVE_WORD.search(text)
    if match:
        return match.group(1).lower()
    return _SHORT.get(text.strip().strip(".!").lower())


@register_env("arithmetic_retry")
class ArithmeticRetry(Environment):
    """`a+b=` with feedback: a wrong answer is told "wrong" and may try again, up to `tries` turns.

    The problems are `hone.data.Arithmetic`'s (same arguments, same hash-based held-out split, so
    evaluation problems are distinct and never trained on). Reward 1.0 for the right value (checked by
    `hone.verifiers.math.math_reward` on the reply: `0412` = `412`, `400+12` refused) in any turn, else 0. The
    smallest multi-turn task that needs its observations: after "wrong", the same answer again is sure
    to fail.
    """

    max_turns = 3

    def __init__(self, tries: int = 3, **task_args: Any) -> None:
        if tries < 1:
            raise ValueError(f"tries must be >= 1, got {tries}")
        self.max_turns = tries
        self.turns = 0
        self.answer = ""

    @classmethod
    def make_samples(cls, n: int, seed: int, split: str, tries: int = 3, **task_args: Any) -> list[Sample]:
        _split_check(split)
        from hone.data import Arithmetic

        task = Arithmetic(**task_args)
        return task.eval_samples(n, seed) if split == "eval" else task.train_samples(n, seed)

    def reset(self, sample: Sample) -> list[Message]:
        self.turns, self.answer = 0, sample.answer or ""
        return [_user(sample.prompt or "")]

    def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        if math_reward(assistant_message, self.answer, require_evaluated=True):
            return StepResult([], reward=1.0, done=True, info={"solved": 1.0})
        return StepResult([_user("wrong")], done=self.turns >= self.max_turns)

    def demonstration(self, sample: Sample) -> list[Message]:
        """Half the time the right answer at once; otherwise one or two near misses (one digit off), each
        told "wrong", then the right answer. The misses have weight 0: SFT teaches recovering after
        "wrong" (a fresh, different answer) without teaching the misses themselves."""
        answer = sample.answer or ""
        rng = random.Random(f"arithmetic_retry/{sample.id}")
        misses = min(rng.choice([0, 0, 1, 2]), self.max_turns - 1) if answer.isdigit() else 0
        messages = [_user(sample.prompt or "")]
        tried = {answer}
        for _ in range(misses):
            miss = _near_miss(answer, rng, tried)
            tried.add(miss)
            messages += [{"role": "assistant", "content": miss, "weight": 0}, _user("wrong")]
        return [*messages, {"role": "assistant", "content": answer}]


def _near_miss(answer: str, rng: random.Random, avoid: set[str]) -> str:
    """`answer` with one digit changed (the kind of slip a small model makes), not in `avoid`."""
    while True:
        at = rng.randrange(len(answer))
        miss = answer[:at] + rng.choice([d for d in "0123456789" if d != answer[at]]) + answer[at + 1 :]
        if miss not in avoid:
            return miss
