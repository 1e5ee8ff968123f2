"""The built-in game `guess_number`: find a secret in 1..high from "higher"/"lower" replies.

See `hone.envs.games` for all the games."""

from __future__ import annotations

import math
import random
import re
from typing import Any

from hone.envs.base import Environment, Message, StepResult, register_env
from hone.envs.games.common import assistant_turn, check_split, user_turn
from hone.types import Sample

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
        check_split(split)
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
                messages=[user_turn(_guess_prompt(high))],
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
        return [user_turn(_guess_prompt(self.high))]

    def step(self, assistant_message: str) -> StepResult:
        self.turns += 1
        out_of_turns = self.turns >= self.max_turns
        match = _INTEGER.search(assistant_message)
        if match is None:
            return StepResult([user_turn("Reply with a number.")], done=out_of_turns, info={"invalid": 1.0})
        guess = _parse_int(match.group())
        information = self._narrow(guess)
        if guess == self.secret:
            return StepResult([], reward=1.0 + information, done=True, info={"solved": 1.0})
        reply = "higher" if guess < self.secret else "lower"
        return StepResult([user_turn(reply)], reward=information, done=out_of_turns)

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
            messages.append(assistant_turn(str(guess)))
            if guess == self.secret:
                return messages
            if guess < self.secret:
                low = guess + 1
                messages.append(user_turn("higher"))
            else:
                high = guess - 1
                messages.append(user_turn("lower"))


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
